"""End to end on a Slurm node: a real `gpuwatch daemon` reads the jobs from stand-in Slurm
commands and counts how long held GPUs sit idle; `gpuwatch status`, `status --json` and the
TUI read all of it from the daemon's socket."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from tests.helpers.cli import run_cli, under
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.daemon_net import free_port
from tests.helpers.slurm_stand_in import NODE, SlurmNode, make_slurm_node
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

WINDOW_S = 2.0
# NODE's GPUs with steady loads: job 1 holds GPUs 1 and 3 (GRES 1 and 0), both idle; job 2
# holds GPU 2, busy; GPU 0 is free (and idle).
LOADS = {4: 0, 5: 0, 6: 80, 7: 0}


def scenario() -> str:
    lines = []
    for line in NODE.read_text().splitlines():
        lines.append(line)
        if line.startswith("minor = "):
            minor = int(line.split("=")[1])
            lines += ['load = "constant"', f"utilization_pct = {LOADS[minor]}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmNode:
    slurm = make_slurm_node(tmp_path / "slurm")
    slurm.apply(monkeypatch)
    return slurm


@pytest.fixture
def daemon(node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A daemon asking the stand-ins every second, with a 2 s idle window, its socket the
    one status finds; yields the socket once the idle GPUs have been idle for the window."""
    (tmp_path / "daemon").mkdir()
    args = ("--jobs-refresh", "1s", "--idle-window", f"{WINDOW_S:g}s")
    with running_daemon(tmp_path / "daemon", *args, env=node.env, scenario=scenario()) as (
        _,
        sock,
        _,
    ):
        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        wait_until(lambda: _idle_for_the_window(sock), "the held idle GPUs to pass the window")
        yield sock


def _idle_for_the_window(sock: Path) -> bool:
    body = get_json(sock, "/v1/jobs")[1]
    idle = body["allocated_idle_s"]
    return len(idle) == 3 and sum(seconds >= WINDOW_S for seconds in idle.values()) == 2


def test_status_shows_each_job_under_its_gpus_and_marks_the_idle_ones(daemon: Path) -> None:
    # WHEN status reads the daemon
    result = run_cli("status", "-v")
    # THEN it read the daemon, not Slurm
    assert result.exit_code == 0, result.stderr
    assert "reading GPUs from the daemon" in result.stderr
    # AND job 1 is under GPUs 1 and 3, idle for the window, job 2 under busy GPU 2
    lines = result.stdout.splitlines()
    assert under(lines, 0) == []
    for index in (1, 3):
        (line,) = under(lines, index)
        assert re.fullmatch(r"  job 1 root  train  1:\d\d:\d\d left  allocated, idle \d+s", line)
    assert under(lines, 2) == ["  job 2 root  eval  no time limit"]
    assert "jobs unknown" not in result.stdout


def test_status_json_has_the_jobs_and_each_held_gpus_idle_seconds(
    daemon: Path, node: SlurmNode
) -> None:
    # WHEN status is asked for JSON through the daemon
    data: dict[str, Any] = json.loads(run_cli("status", "--json").stdout)
    # THEN the jobs are there, by NVML index
    jobs = {job["job_id"]: job["gpus"] for job in data["jobs"]}
    assert jobs == {"1": [1, 3], "2": [2], "3": []}
    assert [gpu["job_id"] for gpu in data["gpus"]] == [None, "1", "2", "1"]
    # AND the idle held GPUs have been idle at least the window; the busy one 0; a free one
    # none; the daemon's seconds are rounded to a tenth
    idle = [gpu["allocated_idle_s"] for gpu in data["gpus"]]
    assert idle[0] is None and idle[2] == 0
    assert idle[1] >= WINDOW_S and idle[3] >= WINDOW_S
    assert all(round(seconds, 1) == seconds for seconds in idle if seconds is not None)
    assert data["allocated_idle_window_s"] == WINDOW_S and data["jobs_error"] is None


def test_the_tui_shows_the_jobs_and_the_idle_mark_on_the_cards(daemon: Path) -> None:
    from gpuwatch.backends import open_backend
    from gpuwatch.sampling.node_jobs import jobs_reader
    from gpuwatch.tui.node.app import GpuwatchApp
    from gpuwatch.tui.node.sources import LocalSource

    # GIVEN the TUI reading the daemon, as `gpuwatch tui` builds it
    opened = open_backend(None, None)
    source = LocalSource(opened, None, jobs=jobs_reader(opened, one_shot=False))
    app = GpuwatchApp([source], interval_s=0.2, as_root=False)

    def cards() -> str:
        return str(app.query_one("#section-0", Static).render())

    async def main() -> str:
        async with app.run_test(size=(160, 40)) as pilot:
            for _ in range(100):  # until the first frames with jobs arrive
                await pilot.pause(0.1)
                if "allocated, idle" in cards():
                    break
            return cards()

    try:
        shown = asyncio.run(main())
    finally:
        source.close()
    # THEN the cards name the jobs, and the idle held GPUs are marked
    title = {int(m.group(1)): m.group(0) for m in re.finditer(r"\[(\d)\] [^│\n]*", shown)}
    assert "job" not in title[0]
    assert "job 1 root  allocated, idle" in title[1] and "job 1 root  allocated, idle" in title[3]
    assert "job 2 root  no time limit" in title[2] and "idle" not in title[2]


def _bare_path(folder: Path) -> str:
    """A PATH without squeue (Slurm may be installed on this machine)."""
    folder.mkdir()
    for tool in ("sh", "sleep", "cat"):
        if (found := shutil.which(tool)) is not None:
            (folder / tool).symlink_to(found)
    return str(folder)


@pytest.mark.parametrize("slurm_here", [False, True], ids=["laptop", "daemon-without-squeue"])
def test_a_daemon_reading_no_scheduler_leaves_the_jobs_to_status(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_here: bool
) -> None:
    # GIVEN a daemon that finds no squeue on its PATH (--jobs auto)
    (tmp_path / "daemon").mkdir()
    bare = _bare_path(tmp_path / "bare-bin")
    env = {**node.env, "PATH": bare}
    with running_daemon(tmp_path / "daemon", env=env, scenario=scenario()) as (_, sock, _):
        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        wait_until(lambda: get_json(sock, "/v1/jobs")[1]["reading"] is False, "no reader")
        # AND this user's shell with squeue on the PATH (a Slurm node), or without (a laptop)
        if not slurm_here:
            monkeypatch.setenv("PATH", bare)
        # WHEN status reads the daemon
        result = run_cli("status")
    # THEN on the laptop nothing is said about jobs; on the Slurm node status asked Slurm
    assert result.exit_code == 0, result.stderr
    if slurm_here:
        assert under(result.stdout.splitlines(), 2) == ["  job 2 root  eval  no time limit"]
        assert node.calls == 1
    else:
        assert "job" not in result.stdout and node.calls == 0


def test_a_daemon_whose_slurm_is_down_makes_status_say_jobs_unknown_and_why(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a daemon whose squeue and scontrol fail (slurmctld down)
    node.squeue("exit 1")
    (tmp_path / "daemon").mkdir()
    args = ("--jobs-refresh", "1s")
    with running_daemon(tmp_path / "daemon", *args, env=node.env, scenario=scenario()) as (
        _,
        sock,
        _,
    ):
        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        failed = lambda: "failed" in (get_json(sock, "/v1/jobs")[1]["error"] or "")  # noqa: E731
        wait_until(failed, "the daemon to find Slurm down")
        # WHEN status reads the daemon, as a table and as JSON
        text = run_cli("status").stdout
        data = json.loads(run_cli("status", "--json").stdout)
    # THEN the GPUs are shown, with one line giving the daemon's reason
    assert "jobs unknown: squeue and scontrol failed (is slurmctld down?)" in text
    assert "[3] " in text and "  job " not in text
    assert data["jobs"] is None and "failed" in data["jobs_error"]


def test_the_fleet_reads_each_gpus_job_and_idle_time_from_the_daemons_metrics(
    node: SlurmNode, tmp_path: Path
) -> None:
    # GIVEN the daemon also serving /metrics on loopback, its held idle GPUs past the window
    (tmp_path / "daemon").mkdir()
    port = free_port()
    args = ("--jobs-refresh", "1s", "--idle-window", f"{WINDOW_S:g}s")
    args += ("--listen", f"127.0.0.1:{port}", "--node-name", "slurm-node")
    with running_daemon(tmp_path / "daemon", *args, env=node.env, scenario=scenario()) as (
        _,
        sock,
        _,
    ):
        wait_until(lambda: _idle_for_the_window(sock), "the held idle GPUs to pass the window")
        # WHEN the fleet scrapes it
        result = run_cli("fleet", "--node", f"127.0.0.1:{port}", "--json")
    # THEN the node knows its jobs, and each GPU names the job that holds it, as status does
    assert result.exit_code == 0, result.stderr
    (fleet_node,) = json.loads(result.stdout)["nodes"]
    assert fleet_node["node"] == "slurm-node" and fleet_node["jobs_known"] is True
    jobs = [(gpu["job_id"], gpu["job_user"]) for gpu in fleet_node["gpus"]]
    assert jobs == [(None, None), ("1", "root"), ("2", "root"), ("1", "root")]
    # AND the held idle GPUs carry their idle time (the metrics' own, not rounded as /v1/jobs
    # rounds), the busy one 0, the free one none
    idle = [gpu["allocated_idle_s"] for gpu in fleet_node["gpus"]]
    assert idle[0] is None and idle[2] == 0
    assert idle[1] > WINDOW_S / 2 and idle[3] > WINDOW_S / 2
