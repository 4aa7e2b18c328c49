"""Which Slurm jobs hold this node's GPUs: asked of Slurm at most every few seconds, with a
deadline, never blocking a caller beyond it.

`SlurmJobs.table()` runs `squeue --json` (Slurm 21.08 on), or `scontrol show job -d
--oneliner` where squeue has no JSON, in a background thread, and maps each job's GRES
indices on this node to device-file minor numbers through gres.conf. A Slurm that is absent
(no squeue), down (an error) or slow (past `timeout_s`: the command and its children are
killed) gives `None`, "jobs unknown". While a call is under way no other is started: the
cache serves the previous answer, so a hung squeue is never piled up on.

`job_id_of_process` tells the job a process runs in, from its cgroup (which slurmstepd
sets) or its `SLURM_JOB_ID` (which the process could set itself: a hint for its own user).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from gpuwatch import procfs
from gpuwatch.jobs.command import run_command
from gpuwatch.jobs.gres import default_gres_conf, gres_gpu_files, minor_number_of
from gpuwatch.jobs.job_table import JobTable
from gpuwatch.jobs.slurm_text import SlurmFormatError, jobs_from_scontrol, jobs_from_squeue_json

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_AGE_S = 5.0
MAX_OUTPUT_BYTES = 256 << 20
"""An answer longer than this is not read (squeue --json is ~4 KiB a job)."""
MAX_GRES_CONF_BYTES = 1 << 20
_CGROUP_JOB = re.compile(r"/slurm[^/]*/(?:uid_\d+/)?job_(\d+)(?:/|$)")


class SlurmJobs:
    """This node's Slurm jobs and the GPUs they hold, cached for `max_age_s`.

    `node` is Slurm's name for this node (default `SLURMD_NODENAME`, else the short host
    name); `gres_conf` the gres.conf naming its GPU files (default: beside `SLURM_CONF`,
    else /etc/slurm/gres.conf). `env` is the environment of the Slurm commands.
    """

    def __init__(
        self,
        *,
        node: str | None = None,
        gres_conf: str | os.PathLike[str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        env: Mapping[str, str] | None = None,
        squeue: str = "squeue",
        scontrol: str = "scontrol",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        # os.uname() rather than socket.gethostname(): the same name, without loading
        # `socket` into every one-shot status on a Slurm node
        self.node = node or self.env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
        self.gres_conf = Path(gres_conf) if gres_conf is not None else default_gres_conf(self.env)
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.squeue, self.scontrol = squeue, scontrol
        self._clock = clock
        self._lock = threading.Lock()
        self._answer: JobTable | None = None
        self._answered_at: float | None = None
        self._pending: threading.Thread | None = None
        self._use_json = True
        self._closed = False
        self.calls = 0
        """How many Slurm commands were started (for tests and benchmarks)."""
        self.last_error: str | None = None
        """Why the latest answer was "jobs unknown"; `None` after one that was not."""

    def table(self) -> JobTable | None:
        """The jobs of this node and their GPUs; `None` when they are unknown.

        Returns at once with the cached answer while it is younger than `max_age_s`, or
        while a refresh is under way (the answer before it, unless that is older than
        `max_age_s` plus two timeouts). Only the first call waits, at most `timeout_s`.
        """
        pending = self.start()
        with self._lock:
            if self._fresh(self.max_age_s):
                return self._answer
            first = self._answered_at is None
        if first and pending is not None:
            pending.join(self.timeout_s)
            if pending.is_alive():
                self.last_error = "timeout"
        with self._lock:
            return self._answer if self._fresh(self.max_age_s + 2 * self.timeout_s) else None

    def start(self) -> threading.Thread | None:
        """Begins a refresh unless the answer is fresh or one is under way, and returns at
        once: a caller about to read the GPUs calls it first, so that Slurm answers meanwhile.
        The refresh under way, if any."""
        with self._lock:
            if not self._fresh(self.max_age_s) and self._pending is None and not self._closed:
                self._pending = threading.Thread(target=self._refresh, daemon=True, name="slurm")
                self._pending.start()
            return self._pending

    def latest(self) -> JobTable | None:
        """The latest answer as it stands, however old: no refresh is started and nothing
        waits (`None` before the first answer, or when it was "jobs unknown"). For a caller
        that keeps its own schedule with `start()`."""
        with self._lock:
            return self._answer

    @property
    def refreshing(self) -> bool:
        """True while a Slurm command is under way."""
        return self._pending is not None

    def close(self) -> None:
        """No more refreshes; one under way is left to end on its deadline."""
        self._closed = True

    def _fresh(self, age_s: float) -> bool:
        return self._answered_at is not None and self._clock() - self._answered_at < age_s

    def _refresh(self) -> None:
        try:
            answer = self._ask()
        except Exception as error:  # a thread's exception would be lost: keep it as the reason
            self.last_error, answer = f"reading Slurm failed: {error!r}", None
        with self._lock:
            self._answer, self._answered_at, self._pending = answer, self._clock(), None

    def _ask(self) -> JobTable | None:
        deadline = self._clock() + self.timeout_s
        minors = self._gres_minors()
        if minors is None:
            return None
        read_at = time.time()
        if self._use_json:
            argv = [self.squeue, "--json", "--states=RUNNING", f"--nodelist={self.node}"]
            text = self._run(argv, deadline)
            if text is not None:
                try:
                    jobs = jobs_from_squeue_json(text, self.node, minors)
                except SlurmFormatError as error:
                    self.last_error = str(error)
                    return None
                self.last_error = None
                return JobTable(tuple(jobs), read_at, "squeue --json")
            if self._clock() >= deadline or self.last_error != "failed":
                return None
        text = self._run([self.scontrol, "show", "job", "-d", "--oneliner"], deadline)
        if text is None:
            return None
        self._use_json = False  # squeue failed where scontrol answered: it has no --json
        self.last_error = None
        return JobTable(tuple(jobs_from_scontrol(text, self.node, minors)), read_at, "scontrol")

    def _gres_minors(self) -> list[int | None] | None:
        """Each GRES index's minor number, from gres.conf (read each time: it is small)."""
        try:
            with open(self.gres_conf, "rb") as file:
                text = file.read(MAX_GRES_CONF_BYTES).decode(errors="replace")
        except OSError as error:
            self.last_error = f"cannot read {self.gres_conf}: {error.strerror}"
            return None
        files = gres_gpu_files(text, self.node)
        if not files:  # AutoDetect=nvml alone: slurmd's own order, which cannot be read here
            self.last_error = f"{self.gres_conf} names no GPU File= for node {self.node}"
            return None
        return [minor_number_of(path) for path in files]

    def _run(self, argv: Sequence[str], deadline: float) -> str | None:
        """The command's output; `None` (and `last_error`: "absent", "failed" or "timeout")
        when it is missing, fails or outlives the deadline."""
        self.calls += 1
        timeout_s = deadline - self._clock()
        out, why = run_command(argv, self.env, timeout_s, MAX_OUTPUT_BYTES)
        if why is not None:
            self.last_error = why
        return out


def job_id_of_process(pid: int, proc: str = procfs.PROC) -> str | None:
    """The Slurm job `pid` runs in: from its cgroup (`.../slurm/uid_N/job_N/...` under
    cgroup v1, `.../slurmstepd.scope/job_N/...` under v2, read under `proc`), else its
    `SLURM_JOB_ID` where its environment is readable (through psutil); `None` outside Slurm
    or when not visible."""
    try:
        paths = procfs.read_cgroup_paths(pid, proc)
    except OSError:
        return None
    for path in paths:
        if match := _CGROUP_JOB.search(path):
            return match.group(1)
    try:
        job_id = psutil.Process(pid).environ().get("SLURM_JOB_ID", "")
    except psutil.Error:  # gone, or another user's
        return None
    return job_id if job_id.isdecimal() and len(job_id) <= 20 else None
