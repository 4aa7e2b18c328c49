"""What gpuwatch reads from /proc itself (`gpuwatch.procfs`), and the family trees and details
of processes read through psutil: over recorded files, live processes that lie about
themselves, and a stand-in process table for what no live process can show."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import psutil
import pytest

from gpuwatch import procfs
from gpuwatch.hostinfo import read_lineage
from gpuwatch.leases.locking import process_uids
from gpuwatch.tui.node.details import read_details
from gpuwatch.tui.node.sources import HostStatsReader
from tests.helpers.other_user import as_user, other_user_ids
from tests.helpers.wait import wait_until

SLEEP = shutil.which("sleep") or "/bin/sleep"

# Recorded from a Linux 6.8 host; the second names itself with spaces and parentheses.
STAT_PYTHON = (
    "4242 (python3) S 4100 4242 4100 34816 4242 4194304 12702 0 0 0 1530 220 0 0 20 0 9 0 "
    "88123456 9876543210 524288 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 "
    "0 0 0 0 0\n"
)
STAT_FORGED = (
    "77 (a) b) S 1 (x) S 9999 77 77 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 500 1000 25 "
    "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
)
LOCKS = (
    "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2171846 0 EOF\n"
    "1: -> FLOCK  ADVISORY  WRITE 4300 fe:00:2171846 0 EOF\n"
    "2: POSIX  ADVISORY  WRITE 900 fe:00:12 0 EOF\n"
    "3: FLOCK  ADVISORY  WRITE 0 103:02:77 0 EOF\n"
    "4: FLOCK  ADVISORY  WRITE 12 zz:00:77 0 EOF\n"
)


def fake_proc(tmp_path: Path, stats: dict[int, str]) -> str:
    for pid, stat in stats.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
    return str(tmp_path)


@contextlib.contextmanager
def running(argv: list[str], stdout: int | None = None) -> Iterator[subprocess.Popen[str]]:
    """`argv` in a session of its own, killed with its children when the block ends."""
    process = subprocess.Popen(argv, stdout=stdout, start_new_session=True, text=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def test_usage_read_from_a_recorded_stat(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {4242: STAT_PYTHON})
    usage = procfs.read_usage_of(4242, proc)
    assert usage.start_ticks == 88123456
    assert usage.cpu_s == (1530 + 220) / procfs.CLOCK_TICKS_PER_S
    assert usage.rss_bytes == 524288 * procfs.PAGE_BYTES


def test_usage_fields_start_after_the_last_parenthesis_of_the_name(tmp_path: Path) -> None:
    # GIVEN the stat of a process that named itself "a) b) S 1 (x"
    proc = fake_proc(tmp_path, {77: STAT_FORGED})
    # THEN its figures are the real ones, not the ones written into its name
    usage = procfs.read_usage_of(77, proc)
    assert usage == (500, (5 + 6) / procfs.CLOCK_TICKS_PER_S, 25 * procfs.PAGE_BYTES)


@pytest.mark.parametrize("stat", ["", "12 (x)", "12 (x) S"], ids=["empty", "name-only", "no-ppid"])
def test_a_truncated_stat_is_refused(tmp_path: Path, stat: str) -> None:
    proc = fake_proc(tmp_path, {12: stat})
    with pytest.raises((ValueError, IndexError)):
        procfs.read_usage_of(12, proc)


def test_a_live_process_named_like_stat_fields_fools_no_reader(tmp_path: Path) -> None:
    # GIVEN a live process that named itself "a) b) S 1 (x"
    named = tmp_path / "a) b) S 1 (x"
    named.symlink_to(SLEEP)
    with running([str(named), "60"]) as process:
        # THEN its parent is the real one, its name is kept, and its start is the kernel's
        link = read_lineage([process.pid])[0]
        assert (link.ppid, link.name) == (os.getpid(), "a) b) S 1 (x")
        started_at = psutil.boot_time() + (
            procfs.read_usage_of(process.pid).start_ticks / procfs.CLOCK_TICKS_PER_S
        )
        assert started_at == pytest.approx(psutil.Process(process.pid).create_time(), abs=0.02)


def test_locks_name_flock_holders_only() -> None:
    # GIVEN a table with a holder, a waiter, a POSIX lock, a holder outside our namespace
    # and a garbled line
    holders = procfs.parse_locks(LOCKS)
    # THEN the holder and the outsider (pid 0) are named; the rest is passed over
    assert holders == {(0xFE, 0, 2171846): [4242], (0x103, 2, 77): [0]}


@pytest.mark.parametrize(
    ("link", "initial"),
    [("pid:[4026531836]", True), ("pid:[4026532451]", False), (None, True)],
    ids=["host", "container", "kernel-will-not-say"],
)
def test_whether_pids_are_the_hosts(tmp_path: Path, link: str | None, initial: bool) -> None:
    (tmp_path / "self" / "ns").mkdir(parents=True)
    if link is not None:
        os.symlink(link, tmp_path / "self" / "ns" / "pid")
    assert procfs.in_initial_pid_namespace(str(tmp_path)) is initial


def test_readers_of_this_process() -> None:
    assert process_uids(os.getpid()) == (os.getuid(), os.geteuid(), os.getresuid()[2])
    assert process_uids(1 << 30) is None
    assert procfs.read_cgroup_paths(os.getpid())  # every process is in a cgroup
    with pytest.raises(FileNotFoundError):
        procfs.read_cgroup_paths(1 << 30)
    assert procfs.read_flock_holders(str(Path("/nonexistent"))) == {}


def test_parents_and_uids_are_read_as_psutil_reads_them(tmp_path: Path) -> None:
    # GIVEN live processes, and recorded ones whose names lie
    with running(["sh", "-c", f"{SLEEP} 60 & echo $!; wait"], stdout=subprocess.PIPE) as shell:
        assert shell.stdout is not None
        sleeper = int(shell.stdout.readline())
        # THEN each one's parent and uids are what psutil says of it
        for pid in (sleeper, shell.pid, os.getpid()):
            assert procfs.read_parent(pid) == psutil.Process(pid).ppid()
            assert procfs.read_uids(pid) == tuple(psutil.Process(pid).uids())
    proc = fake_proc(tmp_path, {77: STAT_FORGED, 4242: STAT_PYTHON})
    assert procfs.read_parent(77, proc) == 9999  # after the last ")", not the forged one
    assert procfs.read_parent(4242, proc) == 4100
    # AND a process gone, or a status without its Uid line, is nobody's
    assert procfs.read_parent(1 << 30) is None and procfs.read_uids(1 << 30) is None
    (tmp_path / "4242" / "status").write_text("Name:\tpython3\nUid:\tx y z w\n")
    assert procfs.read_uids(4242, proc) is None


def test_lineage_of_live_processes_follows_their_parents() -> None:
    # GIVEN this process -> a shell -> sleep
    with running(["sh", "-c", f"{SLEEP} 60 & echo $!; wait"], stdout=subprocess.PIPE) as shell:
        assert shell.stdout is not None
        sleeper = int(shell.stdout.readline())
        # WHEN the lineage of the sleep is read
        lineage = {link.pid: link.ppid for link in read_lineage([sleeper])}
        # THEN it climbs through the shell and this process towards init
        assert lineage[sleeper] == shell.pid
        assert lineage[shell.pid] == os.getpid()
        assert lineage[os.getpid()] == os.getppid()
        assert 1 not in lineage
    assert read_lineage([1 << 30]) == []


class StandInProcess:
    """`psutil.Process` over a table of `pid: (ppid, name)`: a pid not in it is not visible.

    For family trees no live process can show: an ancestor that is hidden, and a loop
    (which only forged or reused pids could make)."""

    table: ClassVar[dict[int, tuple[int, str]]] = {}

    def __init__(self, pid: int) -> None:
        if pid not in self.table:
            raise psutil.NoSuchProcess(pid)
        self.pid = pid

    def oneshot(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def ppid(self) -> int:
        return self.table[self.pid][0]

    def name(self) -> str:
        return self.table[self.pid][1]

    def uids(self) -> SimpleNamespace:
        return SimpleNamespace(real=os.getuid(), effective=os.getuid(), saved=os.getuid())

    def cmdline(self) -> list[str]:
        return ["python", "train.py"]

    def environ(self) -> dict[str, str]:
        return {"A": "1"}


@pytest.fixture
def process_table(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, str]]:
    table: dict[int, tuple[int, str]] = {}
    monkeypatch.setattr(StandInProcess, "table", table)
    monkeypatch.setattr(psutil, "Process", StandInProcess)
    return table


def test_lineage_climbs_to_init_and_stops_at_an_unreadable_parent(
    process_table: dict[int, tuple[int, str]],
) -> None:
    # GIVEN 30 -> 20 -> 10 -> 1, and 40 whose parent 50 is not visible
    process_table.update({30: (20, "worker"), 20: (10, "torchrun"), 10: (1, "bash")})
    process_table[40] = (50, "lonely")
    # WHEN the lineage of 30 and 40 is read
    lineage = {link.pid: (link.ppid, link.name) for link in read_lineage([30, 40])}
    # THEN each chain ends below init or where the host stops answering
    assert lineage == {
        30: (20, "worker"),
        20: (10, "torchrun"),
        10: (1, "bash"),
        40: (50, "lonely"),
    }
    assert {link.uid for link in read_lineage([30])} == {os.getuid()}


def test_lineage_of_a_loop_ends(process_table: dict[int, tuple[int, str]]) -> None:
    # GIVEN two processes that are each other's parent
    process_table.update({5: (6, "a"), 6: (5, "b")})
    assert sorted(link.pid for link in read_lineage([5])) == [5, 6]


def test_details_end_where_an_ancestor_is_not_readable(
    process_table: dict[int, tuple[int, str]],
) -> None:
    # GIVEN a process whose grandparent 5 is not visible
    process_table.update({7: (6, "python"), 6: (5, "bash")})
    # THEN the chain says where it ends
    details = read_details(7)
    assert details.parents[0].split()[::2] == ["6", "bash"]
    assert details.parents[1].split() == ["5", "(not", "readable)"]


PARENT = (
    "import subprocess, sys\n"
    "argv = ['python', 'train.py', '--lr', 'a b']\n"
    "child = subprocess.Popen(argv, executable=sys.argv[1], env={'A': '1'}, cwd=sys.argv[2])\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


def test_details_of_a_forged_process_tree_stay_printable(tmp_path: Path) -> None:
    # GIVEN a process whose parent named itself with a terminal escape
    (tmp_path / "train.py").write_text("import time\ntime.sleep(60)\n")
    evil = tmp_path / "\x1b[2Jevil"
    evil.symlink_to(sys.executable)
    argv = [str(evil), "-c", PARENT, sys.executable, str(tmp_path)]
    with running(argv, stdout=subprocess.PIPE) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_until(lambda: psutil.Process(child).cmdline(), "the child's command line")
        # WHEN its details are read
        details = read_details(child)
        # THEN the command is quoted, the escape is not passed on, and the chain goes on up
        assert details.command == "python train.py --lr 'a b'"
        assert "\x1b" not in details.parents[0] and "evil" in details.parents[0]
        assert details.parents[0].split()[0] == str(parent.pid)
        assert details.parents[1].split()[0] == str(os.getpid())
        assert details.environment == ("A=1",)
    wait_until(lambda: not psutil.pid_exists(child), "the child to be reaped")
    assert read_details(child).command is None


def test_another_users_environment_is_refused_with_a_sentence() -> None:
    # GIVEN another user, who looks at the details of this process (root's, or ours)
    uid, gid = other_user_ids()
    code = (
        "from gpuwatch.tui.node.details import read_details\n"
        f"print(read_details({os.getpid()}).environment[0])\n"
    )
    done = subprocess.run(
        as_user(uid, gid, sys.executable, "-c", code),
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    # THEN the environment is refused, in a sentence that says why
    assert done.stdout.strip() == "not readable by you (only its owner and root may read it)"


def test_host_figures_lie_within_the_machine() -> None:
    # GIVEN the reader of this machine's CPU, memory and swap, read twice
    read = HostStatsReader()
    for stats in (read(), read()):
        # THEN each figure lies within its whole
        assert 0.0 <= stats.cpu_pct <= 100.0
        assert 0 < stats.memory_used_bytes <= stats.memory_total_bytes
        assert stats.memory_total_bytes == psutil.virtual_memory().total
        assert 0 <= stats.swap_used_bytes <= stats.swap_total_bytes
