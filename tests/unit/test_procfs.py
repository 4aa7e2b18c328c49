"""`gpuwatch.procfs`: the parsers over recorded /proc files, and the readers over a fake /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatch import procfs

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
STATUS = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1000\t1001\t1000\n"
LOCKS = (
    "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2171846 0 EOF\n"
    "1: -> FLOCK  ADVISORY  WRITE 4300 fe:00:2171846 0 EOF\n"
    "2: POSIX  ADVISORY  WRITE 900 fe:00:12 0 EOF\n"
    "3: FLOCK  ADVISORY  WRITE 0 103:02:77 0 EOF\n"
    "4: FLOCK  ADVISORY  WRITE 12 zz:00:77 0 EOF\n"
)


def test_stat_fields_start_after_the_last_parenthesis_of_the_name() -> None:
    # GIVEN the stat of a process that named itself "a) b) S 1 (x"
    fields = procfs.stat_fields(STAT_FORGED)
    # THEN its parent is the real one, not the one written into its name
    assert fields[procfs.STAT_PPID] == "9999"
    assert procfs.stat_name(STAT_FORGED) == "a) b) S 1 (x"


def test_stat_fields_of_a_recorded_process() -> None:
    fields = procfs.stat_fields(STAT_PYTHON)
    assert procfs.stat_name(STAT_PYTHON) == "python3"
    assert procfs.stat_parent_pid(STAT_PYTHON) == 4100
    assert (fields[procfs.STAT_UTIME], fields[procfs.STAT_STIME]) == ("1530", "220")
    assert fields[procfs.STAT_STARTTIME] == "88123456"
    assert fields[procfs.STAT_RSS_PAGES] == "524288"


@pytest.mark.parametrize("stat", ["", "12 (x)", "12 (x) S"], ids=["empty", "name-only", "no-ppid"])
def test_a_truncated_stat_has_no_parent(stat: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        procfs.stat_parent_pid(stat)


def test_status_uids_and_their_absence() -> None:
    assert procfs.parse_status_uids(STATUS) == (1000, 1000, 1001, 1000)
    assert procfs.parse_status_uids("Name:\tx\n") is None
    assert procfs.parse_status_uids("Uid:\t10 x\n") is None


def test_locks_name_flock_holders_only() -> None:
    # GIVEN a table with a holder, a waiter, a POSIX lock, a holder outside our namespace
    # and a garbled line
    holders = procfs.parse_locks(LOCKS)
    # THEN the holder and the outsider (pid 0) are named; the rest is passed over
    assert holders == {(0xFE, 0, 2171846): [4242], (0x103, 2, 77): [0]}


def test_boot_time_cmdline_and_environ() -> None:
    assert procfs.parse_boot_time(["cpu  1 2 3\n", "btime 1763900000\n"]) == 1763900000.0
    with pytest.raises(ValueError, match="btime"):
        procfs.parse_boot_time(["cpu 1\n"])
    assert procfs.parse_cmdline("python3\0-c\0print(1)\0") == ["python3", "-c", "print(1)", ""]
    assert procfs.parse_environ("A=1\0B=x=y\0junk\0=nameless\0") == {"A": "1", "B": "x=y"}


def fake_proc(tmp_path: Path, stats: dict[int, str]) -> str:
    for pid, stat in stats.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
    return str(tmp_path)


def test_lineage_climbs_to_init_and_stops_at_an_unreadable_parent(tmp_path: Path) -> None:
    # GIVEN 30 -> 20 -> 10 -> 1, and 40 whose parent 50 is not visible
    proc = fake_proc(
        tmp_path,
        {
            30: "30 (worker) S 20 0 0",
            20: "20 (torchrun) S 10 0 0",
            10: "10 (bash) S 1 0 0",
            40: "40 (lonely) S 50 0 0",
        },
    )
    # WHEN the lineage of 30 and 40 is read
    lineage = {link.pid: (link.ppid, link.name) for link in procfs.read_lineage([30, 40], proc)}
    # THEN each chain ends below init or where /proc stops answering
    assert lineage == {
        30: (20, "worker"),
        20: (10, "torchrun"),
        10: (1, "bash"),
        40: (50, "lonely"),
    }
    assert {link.uid for link in procfs.read_lineage([30], proc)} == {os.getuid()}


def test_lineage_of_a_loop_ends(tmp_path: Path) -> None:
    # GIVEN two processes that (in forged files) are each other's parent
    proc = fake_proc(tmp_path, {5: "5 (a) S 6 0", 6: "6 (b) S 5 0"})
    assert sorted(link.pid for link in procfs.read_lineage([5], proc)) == [5, 6]


def test_parent_pid_of_this_process_and_of_none() -> None:
    assert procfs.parent_pid(os.getpid()) == os.getppid()
    with pytest.raises(FileNotFoundError):
        procfs.parent_pid(1 << 30)


def test_readers_of_this_process() -> None:
    assert procfs.read_uids(os.getpid()) is not None
    assert procfs.read_uids(1 << 30) is None
    assert procfs.read_environ(os.getpid())  # our own environment is ours to read
    assert procfs.read_boot_time() > 0
    assert procfs.read_flock_holders(str(Path("/nonexistent"))) == {}


MEMINFO = (
    "MemTotal:       24683656 kB\nMemFree:        20000000 kB\nMemAvailable:   24119928 kB\n"
    "SwapTotal:       8388604 kB\nSwapFree:        8388604 kB\nHugePages_Total:       0\n"
    "garbage line\nDirectMap4k: x kB\n"
)
PROC_STAT = (
    "cpu  4705 356 584 3699 23 23 0 0 0 0\ncpu0 1393 32 124 1400 11 9 0 0 0 0\n"
    "intr 1462898 1\nbtime 1763900000\n"
)


def test_meminfo_in_bytes_with_bare_counts_kept_and_garbage_passed_over() -> None:
    sizes = procfs.parse_meminfo(MEMINFO)
    assert sizes["MemTotal"] == 24683656 * 1024
    assert sizes["SwapFree"] == 8388604 * 1024
    assert sizes["HugePages_Total"] == 0
    assert "DirectMap4k" not in sizes


def test_cpu_times_count_idle_and_iowait_as_not_busy() -> None:
    busy, total = procfs.parse_cpu_times(PROC_STAT)
    assert total == 4705 + 356 + 584 + 3699 + 23 + 23
    assert busy == total - 3699 - 23
    with pytest.raises(ValueError, match="cpu"):
        procfs.parse_cpu_times("cpu0 1 2 3 4 5\n")


def test_start_time_and_visibility_of_this_process() -> None:
    import time

    assert procfs.visible(os.getpid())
    assert not procfs.visible(1 << 30)
    assert procfs.read_start_time(os.getpid()) <= time.time()


def test_details_of_a_forged_process_tree_stay_printable(tmp_path: Path) -> None:
    from gpuwatch.tui.node.details import read_details

    # GIVEN a process whose parent named itself with a terminal escape, and an ancestor
    # that is not readable
    proc = fake_proc(tmp_path, {7: "7 (python) S 6 0", 6: "6 (\x1b[2Jevil) S 5 0"})
    (tmp_path / "7" / "cmdline").write_text("python\0train.py\0--lr\0a b\0")
    (tmp_path / "7" / "environ").write_text("A=1\0")
    # WHEN its details are read
    details = read_details(7, proc)
    # THEN the command is quoted, the escape is not passed on, and the chain says where it ends
    assert details.command == "python train.py --lr 'a b'"
    assert "\x1b" not in details.parents[0] and "evil" in details.parents[0]
    assert details.parents[1].split() == ["5", "(not", "readable)"]
    assert details.environment == ("A=1",)
    assert read_details(8, proc).command is None
