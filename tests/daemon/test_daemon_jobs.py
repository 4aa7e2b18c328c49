"""A real daemon reading jobs from stand-ins for squeue and scontrol on PATH: who holds each
GPU, idle held GPUs, and a Slurm that is absent, hung, switched off or reconfigured."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.jobs import table_from_record
from tests.helpers.cli import run_cli
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[1] / "jobs" / "data"
# GPUs 0-3 have minor numbers 4-7, as tests/jobs/data's recorded cluster has; in
# squeue-22.05.json job 1 holds minors 4 and 5, job 2 minor 6, and minor 7 is free.
NODE = """
hostname = "slurm-node"
[[gpu]]
minor = 4
load = "constant"
utilization_pct = 0
[[gpu]]
minor = 5
load = "constant"
utilization_pct = 60
[[gpu]]
minor = 6
load = "constant"
utilization_pct = 1
[[gpu]]
minor = 7
load = "constant"
utilization_pct = 0
"""
NO_GPU_JOBS = '{"jobs": []}'


@dataclass
class StandIn:
    """squeue and scontrol stand-ins in `bin`, a slurm.conf and gres.conf beside them."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    def answer(self, text: str) -> None:
        """What squeue prints from now on."""
        (self.root / "squeue.out").write_text(text)

    def hang(self) -> None:
        (self.root / "squeue.hang").touch()

    def calls(self) -> int:
        return len(self._pids())

    def running(self) -> int:
        """How many squeue calls are under way (alive, not yet reaped)."""
        return sum(_alive(pid) for pid in self._pids())

    def _pids(self) -> list[int]:
        log = self.root / "squeue.calls"
        return [int(line) for line in log.read_text().split()] if log.exists() else []

    def env(self, path: str | None = None) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{path or os.environ['PATH']}", "SLURMD_NODENAME": "vm"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def slurm(tmp_path: Path) -> StandIn:
    root = tmp_path / "slurm"
    stand_in = StandIn(root)
    stand_in.bin.mkdir(parents=True)
    stand_in.spool.mkdir()
    squeue = stand_in.bin / "squeue"
    squeue.write_text(
        f"#!/bin/sh\necho $$ >> {root}/squeue.calls\n"
        f"if [ -e {root}/squeue.hang ]; then exec sleep 60; fi\n"
        f"exec cat {root}/squeue.out\n"
    )
    scontrol = stand_in.bin / "scontrol"
    scontrol.write_text("#!/bin/sh\nexit 1\n")
    for script in (squeue, scontrol):
        script.chmod(0o755)
    stand_in.conf.write_text(f"SlurmdSpoolDir={stand_in.spool}\n")
    (root / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/nonexistent/nvidia[4-7]\n")
    stand_in.answer((DATA / "squeue-22.05.json").read_text())
    return stand_in


@pytest.fixture
def daemon(tmp_path: Path, slurm: StandIn) -> Iterator[Path]:
    """A daemon asking the stand-ins every second; yields its socket."""
    args = ("--slurm-conf", str(slurm.conf), "--jobs-refresh", "1s")
    with running_daemon(tmp_path, *args, env=slurm.env(), scenario=NODE) as (_, sock, _):
        yield sock


def jobs_of(sock: Path) -> dict[str, Any]:
    status, body = get_json(sock, "/v1/jobs")
    assert status == 200
    return body  # type: ignore[no-any-return]


def metrics_of(sock: Path) -> dict[str, list[Any]]:
    status, body = http_get(str(sock), "/metrics")
    assert status == 200
    families = text_string_to_metric_families(body.decode())
    return {family.name: family.samples for family in families}


def uuids_by_minor(sock: Path) -> dict[int, str]:
    gpus = get_json(sock, "/v1/snapshot")[1]["gpus"]
    return {gpu["minor_number"]: gpu["uuid"] for gpu in gpus}


def known(sock: Path) -> dict[str, Any] | None:
    body = jobs_of(sock)
    return body if body["known"] else None


def test_the_jobs_route_tells_each_jobs_gpus_and_how_long_held_gpus_idle(
    daemon: Path,
) -> None:
    # WHEN Slurm has answered
    body = wait_until(lambda: known(daemon), "the jobs to be known")
    # THEN the jobs are there, with their GPUs by minor number
    held = {job["job_id"]: job["gpu_minor_numbers"] for job in body["jobs"]}
    assert held == {"1": [4, 5], "2": [6], "3": []}
    assert body["source"] == "squeue --json" and body["idle_window_s"] == 600
    # AND a client reads it back with the jobs' own codec
    table = table_from_record(body)
    assert table is not None and table.job_on(4).job_id == "1"  # type: ignore[union-attr]
    # AND each held GPU's idle time, by uuid: the busy one's 0, the idle ones' counting up
    uuids = uuids_by_minor(daemon)
    idle_of = lambda: {m: jobs_of(daemon)["allocated_idle_s"].get(u) for m, u in uuids.items()}  # noqa: E731
    idle = wait_until(lambda: (i := idle_of())[4] and i[6] and i, "idle time to count up")
    assert idle[5] == 0 and idle[7] is None


def test_metrics_name_the_job_on_each_held_gpu_and_only_there(daemon: Path) -> None:
    wait_until(lambda: known(daemon), "the jobs to be known")
    metrics = metrics_of(daemon)
    uuids = uuids_by_minor(daemon)
    info = {s.labels["uuid"]: s.labels["job_id"] for s in metrics["gpuwatch_gpu_job_info"]}
    assert info == {uuids[4]: "1", uuids[5]: "1", uuids[6]: "2"}
    assert metrics["gpuwatch_jobs_known"][0].value == 1
    idle = {s.labels["uuid"] for s in metrics["gpuwatch_gpu_allocated_idle_seconds"]}
    assert idle == {uuids[4], uuids[5], uuids[6]}


def test_a_job_that_ends_leaves_no_series(daemon: Path, slurm: StandIn) -> None:
    # GIVEN the jobs known
    wait_until(lambda: known(daemon), "the jobs to be known")
    # WHEN the jobs end
    slurm.answer(NO_GPU_JOBS)
    # THEN no GPU is said to be held, in the API or the metrics
    wait_until(lambda: (j := known(daemon)) and j["jobs"] == [], "the jobs to be gone")
    metrics = metrics_of(daemon)
    assert not metrics["gpuwatch_gpu_job_info"]
    assert not metrics["gpuwatch_gpu_allocated_idle_seconds"]
    assert jobs_of(daemon)["allocated_idle_s"] == {}


def test_a_hung_squeue_delays_neither_snapshots_nor_metrics(tmp_path: Path, slurm: StandIn) -> None:
    # GIVEN a squeue that hangs
    slurm.hang()
    args = ("--slurm-conf", str(slurm.conf), "--jobs-refresh", "1s")
    with running_daemon(tmp_path, *args, env=slurm.env(), scenario=NODE) as (_, sock, _):
        wait_until(lambda: slurm.calls() >= 1, "squeue to be asked")
        # WHEN clients ask while it hangs
        samples = get_json(sock, "/v1/health")[1]["samples"]
        # THEN snapshots keep coming and are served, and the metrics answer
        wait_until(
            lambda: get_json(sock, "/v1/health")[1]["samples"] > samples + 3, "sampling to go on"
        )
        assert get_json(sock, "/v1/snapshot")[0] == 200
        assert metrics_of(sock)["gpuwatch_jobs_known"][0].value == 0
        # AND one squeue hangs at a time, never piled up, until its deadline makes jobs unknown
        assert slurm.running() <= 1
        body = wait_until(
            lambda: (j := jobs_of(sock))["error"] and "within" in j["error"] and j,
            "the deadline to pass",
        )
        assert body["known"] is False and body["jobs"] is None
        assert body["error"] == "Slurm did not answer within 5s"
        assert slurm.running() <= 1


@pytest.mark.parametrize(
    ("args", "on_path", "error"),
    [
        (["--jobs", "slurm"], False, "squeue is not found"),
        (
            ["--jobs", "auto"],
            False,
            "no scheduler here: squeue is not on PATH (--jobs slurm to insist)",
        ),
        (["--jobs", "off"], True, "job reading is off (--jobs off)"),
    ],
    ids=["slurm-missing", "auto-none", "off"],
)
def test_without_slurm_the_daemon_serves_and_says_why_jobs_are_unknown(
    tmp_path: Path, slurm: StandIn, args: list[str], on_path: bool, error: str
) -> None:
    # GIVEN no squeue on PATH, or one that --jobs off must never call
    env = slurm.env() if on_path else {"PATH": _path_without_squeue(tmp_path)}
    args = [*args, "--slurm-conf", str(slurm.conf)]
    with running_daemon(tmp_path, *args, env=env, scenario=NODE) as (_, sock, _):
        # THEN the daemon serves, and the jobs are unknown, saying why
        assert get_json(sock, "/v1/snapshot")[0] == 200
        body = wait_until(lambda: (j := jobs_of(sock))["error"] == error and j, error)
        assert body == {
            "known": False,
            "error": error,
            "jobs": None,
            "allocated_idle_s": {},
            "idle_window_s": 600.0,
            "reading": args[1] == "slurm",  # insisting, it asks (and finds none)
        }
        assert metrics_of(sock)["gpuwatch_jobs_known"][0].value == 0
    assert slurm.calls() == 0


def _path_without_squeue(tmp_path: Path) -> str:
    """A PATH with the Python of the tests and no squeue (Slurm may be installed here)."""
    bare = tmp_path / "bare-bin"
    bare.mkdir()
    for tool in ("sh", "sleep", "cat"):
        if (found := shutil.which(tool)) is not None:
            (bare / tool).symlink_to(found)
    return str(bare)


def test_sighup_rebuilds_the_reader_from_the_config_file(tmp_path: Path, slurm: StandIn) -> None:
    # GIVEN a daemon told by its config file not to read jobs
    config = tmp_path / "daemon.toml"
    config.write_text(f'jobs = "off"\nslurm_conf = "{slurm.conf}"\njobs_refresh = "1s"\n')
    args = ("--config", str(config))
    with running_daemon(tmp_path, *args, env=slurm.env(), scenario=NODE) as (process, sock, _):
        assert jobs_of(sock)["error"] == "job reading is off (--jobs off)"
        # WHEN the file turns Slurm on, with another idle window, and the daemon reloads
        config.write_text(
            f'jobs = "slurm"\nslurm_conf = "{slurm.conf}"\nidle_window = "30m"\n'
            'jobs_refresh = "1s"\n'
        )
        process.send_signal(signal.SIGHUP)
        # THEN it reads the jobs, and judges idleness by the new window
        body = wait_until(lambda: known(sock), "the jobs to be known")
        assert body["idle_window_s"] == 1800 and slurm.calls() >= 1


def test_slurmds_spool_folder_changing_makes_the_daemon_ask_at_once(
    tmp_path: Path, slurm: StandIn
) -> None:
    # GIVEN a daemon that asks Slurm only every hour, and knows the jobs
    args = ("--slurm-conf", str(slurm.conf), "--jobs-refresh", "1h")
    with running_daemon(tmp_path, *args, env=slurm.env(), scenario=NODE) as (_, sock, _):
        wait_until(lambda: known(sock), "the jobs to be known")
        # WHEN the jobs end, and slurmd removes a step's socket from its spool folder
        slurm.answer(NO_GPU_JOBS)
        step = slurm.spool / "vm_1.0"
        step.touch()
        step.unlink()
        # THEN the daemon sees it long before the hour is out
        wait_until(lambda: (j := known(sock)) and j["jobs"] == [], "the jobs to be gone")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--jobs", "pbs"], "Invalid value for '--jobs'"),
        (["--jobs-refresh", "100ms"], "is too short: the least is 1s"),
        (["--idle-window", "soon"], "'soon' is not a duration"),
        (["--slurm-conf", ""], "Invalid value for '--slurm-conf': give a path"),
    ],
    ids=["bad-engine", "refresh-too-short", "window-word", "empty-slurm-conf"],
)
def test_bad_job_flags_are_one_line_and_exit_code_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("daemon", "--sim", "2", "--socket", str(tmp_path / "s.sock"), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('jobs = "pbs"', "jobs 'pbs': give one of auto, slurm, kubernetes, off"),
        ('jobs_refresh = "0s"', "jobs_refresh '0s' is too short"),
        ('idle_window = "forever"', "idle_window 'forever' is not a duration"),
    ],
    ids=["bad-engine", "refresh-zero", "window-word"],
)
def test_bad_job_settings_in_the_config_file_name_the_file(
    tmp_path: Path, line: str, message: str
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(line + "\n")
    result = run_cli(
        "daemon", "--sim", "2", "--socket", str(tmp_path / "s"), "--config", str(config)
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert str(config) in result.stderr and message in result.stderr


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


GOOD_GRES_CONF = "AutoDetect=off\nName=gpu File=/nonexistent/nvidia[4-7]\n"


@pytest.mark.parametrize(
    ("gres_conf", "slurm_conf", "hang", "says"),
    [
        pytest.param(
            "NodeName=a[0-65535]b[0-65535] Name=gpu File=/dev/nvidia0\n",
            "",
            False,
            "more than 65536 names",
            id="a-hostlist-of-4-gi-names",
        ),
        pytest.param("include gpus.fifo\n", "", False, "a FIFO", id="an-include-of-a-fifo"),
        pytest.param(
            GOOD_GRES_CONF, "include gpus.fifo\n", False, "a FIFO", id="slurm-conf-includes-a-fifo"
        ),
        pytest.param(GOOD_GRES_CONF, "", True, "did not answer", id="a-hung-squeue"),
    ],
)
def test_reloads_leave_no_thread_behind(
    tmp_path: Path, slurm: StandIn, gres_conf: str, slurm_conf: str, hang: bool, says: str
) -> None:
    # GIVEN a daemon whose gres.conf or slurm.conf cannot be read (a hostlist of 4 Gi
    # names, an include of a FIFO nobody writes), or whose squeue hangs
    os.mkfifo(slurm.root / "gpus.fifo")
    (slurm.root / "gres.conf").write_text(gres_conf)
    with slurm.conf.open("a") as conf:
        conf.write(slurm_conf)
    if hang:
        slurm.hang()
    config = tmp_path / "daemon.toml"

    def configure(idle_minutes: int) -> None:
        config.write_text(
            f'jobs = "slurm"\nslurm_conf = "{slurm.conf}"\njobs_refresh = "1s"\n'
            f'idle_window = "{idle_minutes}m"\n'
        )

    def reread(idle_minutes: int) -> bool:
        body = jobs_of(sock)
        return body["idle_window_s"] == idle_minutes * 60 and says in (body["error"] or "")

    configure(10)
    args = ("--config", str(config))
    with running_daemon(tmp_path, *args, env=slurm.env(), scenario=NODE) as (process, sock, _):
        wait_until(lambda: reread(10), "the jobs to be unknown, saying why", timeout_s=60)
        before = threads_of(process.pid)
        # WHEN it is reloaded five times, each time answering again
        for idle_minutes in range(11, 16):
            configure(idle_minutes)
            process.send_signal(signal.SIGHUP)
            wait_until(lambda m=idle_minutes: reread(m), f"reload {idle_minutes}", timeout_s=60)
        # THEN no reload left a thread of its own behind
        wait_until(
            lambda: threads_of(process.pid) <= before,
            f"the daemon's threads back to {before}",
            timeout_s=60,
        )
