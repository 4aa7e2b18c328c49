"""Host details of GPU processes, read from /proc (real and fabricated)."""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch import hostinfo
from gpuwatch.hostinfo import HostProcessTable, shell_command

TICKS = os.sysconf("SC_CLK_TCK")


def fake_proc(
    root: Path,
    pid: int,
    *,
    comm: str,
    argv: list[str],
    cpu_ticks: int,
    start_ticks: int,
    rss_pages: int = 10,
    boot_time: int = 1_700_000_000,
) -> None:
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {boot_time}\n")
    process = root / str(pid)
    process.mkdir(exist_ok=True)
    rest = (
        ["S"]
        + ["0"] * 10
        + [str(cpu_ticks), "0"]
        + ["0"] * 6
        + [str(start_ticks), "0", str(rss_pages)]
    )
    (process / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (process / "cmdline").write_text("\0".join(argv) + ("\0" if argv else ""))


def test_live_process_has_user_command_rss_and_start_time() -> None:
    # GIVEN this very process, which has been running for a while
    details = HostProcessTable().lookup({os.getpid()})[os.getpid()]
    assert details.user == pwd.getpwuid(os.getuid()).pw_name
    argv = Path(f"/proc/{os.getpid()}/cmdline").read_text().rstrip("\0").split("\0")
    assert shlex.split(details.command or "") == argv
    assert details.rss_bytes and details.rss_bytes > 1 << 20
    assert details.started_at is not None and details.started_at < time.time()
    assert details.cpu_pct is not None and details.cpu_pct > 0


def test_vanished_and_foreign_pids_give_no_details() -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert HostProcessTable().lookup({exited.pid, 2**22 + 7}) == {}


def test_cpu_is_lifetime_average_first_then_since_the_last_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a process that started 100 s after boot and has used 50 s of CPU by t = boot + 200 s
    boot = 1_700_000_000
    now = [boot + 200.0]
    monkeypatch.setattr(hostinfo.time, "time", lambda: now[0])
    fake_proc(
        tmp_path,
        42,
        comm="python",
        argv=["python", "train.py"],
        cpu_ticks=50 * TICKS,
        start_ticks=100 * TICKS,
        boot_time=boot,
    )
    table = HostProcessTable(proc=str(tmp_path))
    first = table.lookup({42})[42]
    # THEN the first look is the lifetime average: 50 s over 100 s
    assert first.cpu_pct == 50.0
    assert first.started_at == boot + 100 and first.command == "python train.py"
    # WHEN 10 s later it has used 9 s more
    now[0] += 10
    fake_proc(
        tmp_path,
        42,
        comm="python",
        argv=["python", "train.py"],
        cpu_ticks=59 * TICKS,
        start_ticks=100 * TICKS,
        boot_time=boot,
    )
    # THEN the next look is the average over those 10 s
    assert table.lookup({42})[42].cpu_pct == 90.0


def test_reused_pid_starts_measuring_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = 1_700_000_000
    monkeypatch.setattr(hostinfo.time, "time", lambda: boot + 400.0)
    fake_proc(
        tmp_path, 7, comm="a", argv=["a"], cpu_ticks=10 * TICKS, start_ticks=0, boot_time=boot
    )
    table = HostProcessTable(proc=str(tmp_path))
    table.lookup({7})
    # WHEN pid 7 now names a process started at boot + 300 s with 50 s of CPU
    fake_proc(
        tmp_path,
        7,
        comm="b",
        argv=["b"],
        cpu_ticks=50 * TICKS,
        start_ticks=300 * TICKS,
        boot_time=boot,
    )
    assert table.lookup({7})[7].cpu_pct == 50.0


def test_kernel_thread_without_cmdline_is_named_by_comm(tmp_path: Path) -> None:
    fake_proc(tmp_path, 9, comm="weird) name (x", argv=[], cpu_ticks=0, start_ticks=0)
    assert HostProcessTable(proc=str(tmp_path)).lookup({9})[9].command == "weird) name (x"


def test_a_process_that_exits_is_forgotten_with_its_descriptor() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    table = HostProcessTable()
    open_before = len(os.listdir("/proc/self/fd"))
    try:
        assert sleeper.pid in table.lookup({sleeper.pid})
        assert len(os.listdir("/proc/self/fd")) == open_before + 1  # its stat, kept open
    finally:
        sleeper.kill()
        sleeper.wait()
    assert table.lookup({sleeper.pid}) == {}
    assert len(os.listdir("/proc/self/fd")) == open_before


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["python3", "-c", "import time; time.sleep(300)"],
            "python3 -c 'import time; time.sleep(300)'",
        ),
        (["python", "train.py", "--lr", "0.1"], "python train.py --lr 0.1"),
        (["sh", "-c", "echo it's"], "sh -c 'echo it'\"'\"'s'"),
        (["prog", "", "x"], "prog '' x"),
        (["postgres: checkpointer", "", ""], "postgres: checkpointer"),
    ],
    ids=["python-c", "plain", "single-quote", "empty-argument", "rewritten-title"],
)
def test_command_lines_are_quoted_as_a_shell_would(
    tmp_path: Path, argv: list[str], shown: str
) -> None:
    # GIVEN a process whose /proc/PID/cmdline holds ARGV, NUL-separated
    fake_proc(tmp_path, 5, comm="x", argv=argv, cpu_ticks=0, start_ticks=0)
    # THEN its command is the line that would run it again
    assert HostProcessTable(proc=str(tmp_path)).lookup({5})[5].command == shown


@given(st.lists(st.text(min_size=1), min_size=2, max_size=6))
@settings(max_examples=200)
def test_a_quoted_command_splits_back_into_its_arguments(argv: list[str]) -> None:
    argv = [arg.replace("\0", "") or "x" for arg in argv]
    assert shlex.split(shell_command(argv)) == argv


def test_inside_another_pid_namespace_no_host_pid_is_attributed(tmp_path: Path) -> None:
    # GIVEN gpuwatch in a container's PID namespace, where the driver's pid 1 (the host's
    # init) and pid 42 name the container's own, unrelated processes
    for pid in (1, 42):
        fake_proc(tmp_path, pid, comm="sh", argv=["sh"], cpu_ticks=0, start_ticks=0)
    (tmp_path / "self" / "ns").mkdir(parents=True)
    os.symlink("pid:[4026532451]", tmp_path / "self" / "ns" / "pid")
    table = HostProcessTable(proc=str(tmp_path))
    # THEN none of them is given the local process's user or command
    assert not table.pids_are_local
    assert table.lookup({1, 42}) == {}


def test_in_the_initial_pid_namespace_pids_are_looked_up(tmp_path: Path) -> None:
    fake_proc(tmp_path, 42, comm="sh", argv=["sh"], cpu_ticks=0, start_ticks=0)
    (tmp_path / "self" / "ns").mkdir(parents=True)
    os.symlink("pid:[4026531836]", tmp_path / "self" / "ns" / "pid")
    assert HostProcessTable(proc=str(tmp_path)).lookup({42})[42].command == "sh"


def test_descriptors_stay_bounded_however_many_processes_and_all_get_details(
    tmp_path: Path,
) -> None:
    # GIVEN a node with 300 GPU processes, and a table that keeps at most 100 files open
    for pid in range(1000, 1300):
        fake_proc(tmp_path, pid, comm="python", argv=["python"], cpu_ticks=0, start_ticks=pid)
    table = HostProcessTable(proc=str(tmp_path), max_open_files=100)
    before = len(os.listdir("/proc/self/fd"))
    # WHEN it looks them up, twice (the second look re-reads what it knows)
    pids = set(range(1000, 1300))
    table.lookup(pids)
    found = table.lookup(pids)
    # THEN every process has its user, and no more than 100 descriptors are held
    assert len(found) == 300 and all(p.user for p in found.values())
    assert len(os.listdir("/proc/self/fd")) - before <= 100
    # AND a process that is no longer asked for gives its descriptor back
    table.lookup(set())
    assert len(os.listdir("/proc/self/fd")) <= before
