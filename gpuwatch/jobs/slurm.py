"""Which Slurm jobs hold this node's GPUs: asked of Slurm at most every few seconds, with a
deadline, never blocking a caller beyond it.

`SlurmJobs.table()` runs `squeue --json` (Slurm 21.08 on), or where squeue has no JSON
`squeue -o` of fields no user writes and each job's `scontrol show job -d` for its GRES
indices (`slurm_text` says why), in a background thread, and maps each job's GRES indices
on this node to device-file minor numbers as slurmd numbers them (`gres_conf`). A Slurm
that is absent (no squeue), down (an error), slow (past `timeout_s`: the command and its
children are killed) or answering past `MAX_OUTPUT_BYTES` gives `None`, "jobs unknown",
and so does a node whose GPU order cannot be told. A record of the answer that cannot be
believed is dropped alone, as one of the table's `doubts` (`slurm_text`). While a call is
under way no other is started: the cache serves the previous answer, so a hung squeue is
never piled up on.

`job_id_of_process` tells the job a process runs in, from its cgroup (which slurmstepd
sets) or its `SLURM_JOB_ID` (which the process could set itself: a hint for its own user).
"""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from gpuwatch import procfs
from gpuwatch.jobs.command import Commands
from gpuwatch.jobs.gres import default_gres_conf, minors_of_indices, node_gpu_minors
from gpuwatch.jobs.gres_conf import DetectedGpu, GresOrderUnknown, detected_gpus
from gpuwatch.jobs.job_table import Doubt, Job, JobTable, believed
from gpuwatch.jobs.slurm_config import SlurmConfigError, read_config
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.jobs.slurm_text import (
    ROW_FORMAT,
    JobRow,
    SlurmFormatError,
    detail_indices,
    jobs_from_squeue_json,
    kept_doubts,
    name_in_detail,
    rows_from_squeue,
)
from gpuwatch.models import Snapshot

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_AGE_S = 5.0
MAX_OUTPUT_BYTES = 8 << 20
"""The most a Slurm command may answer here (8 MiB); a longer answer is not read. A node
runs at most as many jobs as it has CPUs unless oversubscribed (a few hundred on the
largest), and `squeue --json` writes about 3.5 KiB a job (22.05; more from 23.02 on): 8
MiB holds 1,024 jobs of 8 KiB. 22.05's squeue lists the whole cluster's jobs under
`--json`, whatever it is asked: where that passes the cap, the reader turns to `squeue -o`
rows, which squeue filters to this node's."""
DEFAULT_SPOOL_DIR = "/var/spool/slurmd"
"""Slurm's own default SlurmdSpoolDir, where slurm.conf does not say."""
_ROWS = "squeue, scontrol"
_Found = tuple[list[Job], list[Doubt]]
_CGROUP_JOB = re.compile(r"/slurm[^/]*/(?:uid_\d+/)?job_(\d+)(?:/|$)")
_REASONS = {
    "absent": "squeue is not found",
    "failed": "squeue and scontrol failed (is slurmctld down?)",
    "too large": (
        f"squeue or scontrol answered more than {MAX_OUTPUT_BYTES >> 20} MiB, more than "
        "this node's running jobs could need"
    ),
    "closed": "job reading stopped",
}


def slurm_node_name(env: Mapping[str, str], given: str | None = None) -> str:
    """Slurm's name for this node: `SLURMD_NODENAME` (slurmd's own word for it, set in every
    job, or by an admin for the daemon), else `given` (the daemon's --node-name, for a
    container whose host name is not the node's), else the short host name."""
    return env.get("SLURMD_NODENAME") or given or socket.gethostname().split(".")[0]


class SlurmJobs:
    """This node's Slurm jobs and the GPUs they hold, cached for `max_age_s`.

    `node` is Slurm's name for this node (`slurm_node_name`); `gres_conf` the gres.conf
    (default: beside the slurm.conf in use, `configured_slurm_conf`). `env` is the environment of
    the Slurm commands.
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
        self.node = slurm_node_name(self.env, node)
        slurm_conf = configured_slurm_conf(self.env)
        self.slurm_conf = Path(slurm_conf) if slurm_conf is not None else None
        if gres_conf is None:  # beside the slurm.conf in use (a configless node's copy too)
            beside = self.slurm_conf.parent / "gres.conf" if self.slurm_conf else None
            gres_conf = beside or default_gres_conf(self.env)
        self.gres_conf = Path(gres_conf)
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.squeue, self.scontrol = squeue, scontrol
        self._clock = clock
        self._lock = threading.Lock()
        self._commands = Commands()
        self._answer: JobTable | None = None
        self._answered_at: float | None = None
        self._pending: threading.Thread | None = None
        self._detected: tuple[DetectedGpu, ...] | None = None
        self._use_json = True
        self._closed = False
        self._lacked_gpus = False
        self.calls = 0
        """How many Slurm commands were started (for tests and benchmarks)."""
        self.last_error: str | None = None
        """Why the latest answer was "jobs unknown" ("absent", "failed", "timeout", or
        a sentence); `None` after one that was not."""

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

    def observe(self, snapshot: Snapshot) -> None:
        """This node's GPUs as NVML enumerates them: where slurmd numbers GPUs in NVML's
        order (gres.conf's `AutoDetect=nvml`), it is the order of their GRES indices."""
        if (detected := detected_gpus(snapshot.gpus)) is not None:
            self._detected = detected

    def lacked_gpus(self) -> bool:
        return self._lacked_gpus

    def unknown_why(self) -> str:
        """Why the jobs are unknown, in words."""
        code = self.last_error
        if code is None:
            return "Slurm has not answered yet"
        if code == "timeout":
            return f"Slurm did not answer within {self.timeout_s:g}s"
        return _REASONS.get(code, code)

    def describe(self) -> str:
        return f"Slurm's jobs on node {self.node}"

    def changes_path(self) -> Path | None:
        """slurmd's spool folder (SlurmdSpoolDir): slurmd makes a socket there for each job
        step that starts and removes it when the step ends, so a change of the folder says
        "ask again" sooner than any schedule, for the cost of a stat. `None` when slurm.conf
        cannot be read."""
        if self.slurm_conf is None:
            return None
        return spool_dir(self.slurm_conf, self.node)

    @property
    def refreshing(self) -> bool:
        """True while a Slurm command is under way."""
        return self._pending is not None

    def close(self) -> None:
        """No more refreshes; a Slurm command under way is killed."""
        self._closed = True
        self._commands.close()

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
                found = functools.partial(jobs_from_squeue_json, text, self.node, minors)
                return self._table(found, read_at, "squeue --json")
            if self._clock() >= deadline or self.last_error not in ("failed", "too large"):
                return None
        table = self._table(lambda: self._jobs_from_rows(minors, deadline), read_at, _ROWS)
        if table is not None:
            # squeue --json failed (no --json) or answered too much (22.05's lists the
            # cluster) where -o answered: rows from now on
            self._use_json = False
        return table

    def _table(
        self, read: Callable[[], _Found | None], read_at: float, source: str
    ) -> JobTable | None:
        try:
            found = read()
        except SlurmFormatError as error:
            self.last_error = str(error)
            return None
        if found is None:
            return None
        jobs, doubts = found
        self.last_error = None
        return JobTable(tuple(jobs), read_at, source, tuple(doubts))

    def _jobs_from_rows(self, minors: list[int | None], deadline: float) -> _Found | None:
        """The running jobs here from `squeue -o`, each with its GPUs from its own
        `scontrol show job -d` (Slurm without `squeue --json`); `None` where a command
        failed."""
        argv = [self.squeue, "-h", "--states=RUNNING", f"--nodelist={self.node}", "-o", ROW_FORMAT]
        text = self._run(argv, deadline)
        if text is None:
            return None
        rows, doubts = rows_from_squeue(text)
        jobs: list[Job] = []
        for row in rows:
            if self.node not in row.nodes:
                continue
            found = self._job_of_row(row, minors, deadline)
            if found is None:
                return None
            if isinstance(found, Job):
                jobs.append(found)
            else:
                doubts.append(found)
        return jobs, kept_doubts(doubts)

    def _job_of_row(
        self, row: JobRow, minors: list[int | None], deadline: float
    ) -> Job | Doubt | None:
        text = self._run([self.scontrol, "show", "job", "-d", "--oneliner", row.raw_id], deadline)
        if text is None:
            return None
        try:
            indices = detail_indices(text, self.node) or []
        except ValueError as error:  # a forged detail group, garbled indices
            return Doubt(f"job {row.job_id}: {error}")
        return believed(
            Job(
                job_id=row.job_id,
                user=row.user,
                name=name_in_detail(text, row.user),
                gpu_minor_numbers=minors_of_indices(indices, minors),
                started_at=row.start_s,
                time_limit_s=row.time_limit_s,
                state="RUNNING",
            )
        )

    def _gres_minors(self) -> list[int | None] | None:
        """Each GRES index's minor number, as slurmd numbers them (read each time: the
        files are small, and an edited gres.conf takes effect without a restart)."""
        detected = self._detected
        try:
            minors = node_gpu_minors(self.gres_conf, self.slurm_conf, self.node, detected)
        except GresOrderUnknown as error:
            self.last_error, self._lacked_gpus = str(error), detected is None
            return None
        self._lacked_gpus = False
        return minors

    def _run(self, argv: Sequence[str], deadline: float) -> str | None:
        """The command's output; `None` (and `last_error`: "absent", "failed", "too
        large", "timeout" or "closed") when it is missing, fails, answers past the cap or
        outlives the deadline."""
        self.calls += 1
        timeout_s = deadline - self._clock()
        answer = self._commands.run(argv, self.env, timeout_s, MAX_OUTPUT_BYTES)
        if answer.why is not None:
            self.last_error = answer.why
        return answer.out


def spool_dir(slurm_conf: Path, node: str) -> Path:
    """slurm.conf's SlurmdSpoolDir, with `%n` (the node) and `%h` (the host) filled in;
    Slurm's default where it is not set or slurm.conf cannot be read."""
    spool = DEFAULT_SPOOL_DIR
    try:
        for line in read_config(slurm_conf):
            if line.first_key == "slurmdspooldir" and (value := line.get("SlurmdSpoolDir")):
                spool = value
    except SlurmConfigError:
        spool = DEFAULT_SPOOL_DIR
    host = socket.gethostname().split(".")[0]
    return Path(spool.replace("%n", node).replace("%h", host))


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
