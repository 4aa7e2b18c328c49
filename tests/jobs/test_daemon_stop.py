"""A daemon stopped while Slurm hangs: the squeue it started is killed with it, and never
ignored the signal that stops the service (the daemon blocks SIGTERM in its threads)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers.daemon import running_daemon
from tests.helpers.wait import wait_until

HUNG_SQUEUE = """#!/bin/sh
echo $$ > {out}.pid
exec sleep 120
"""


def blocked_signals(pid: int) -> int:
    """The mask of signals `pid` blocks (SigBlk in its /proc status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_stopping_the_daemon_kills_the_squeue_it_waits_for(tmp_path: Path) -> None:
    # GIVEN a daemon reading jobs from a squeue that hangs
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "squeue").write_text(HUNG_SQUEUE.format(out=tmp_path / "squeue"))
    (folder / "squeue").chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    args = ("--jobs", "slurm", "--slurm-conf", str(tmp_path / "slurm.conf"))
    env = {"PATH": f"{folder}:{os.environ['PATH']}", "SLURMD_NODENAME": "vm"}
    pid_file = tmp_path / "squeue.pid"
    with running_daemon(tmp_path, *args, env=env) as (daemon, _, _):
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "squeue to run")
        squeue = int(pid_file.read_text())
        # THEN squeue blocks no signal
        assert blocked_signals(squeue) == 0
        # WHEN the daemon is stopped, long before squeue's deadline
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    # THEN squeue does not outlive it
    wait_until(lambda: not alive(squeue), "the daemon's squeue to be gone", timeout_s=10)
