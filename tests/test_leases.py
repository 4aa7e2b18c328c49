"""Leases across real processes: held while the holder lives, gone the moment it dies."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.errors import LeaseError
from gpuwatch.leases import LeaseDir, default_lease_dir
from gpuwatch.models import GpuSample
from gpuwatch.policy import Request

GPU = GpuSample(index=3, uuid="GPU-3", name="H100", pci_bus_id=None)

HOLDER = """
import sys, time
from pathlib import Path
from gpuwatch.leases import LeaseDir
from gpuwatch.models import GpuSample
lease_dir = LeaseDir(Path(sys.argv[1]))
with lease_dir.locked():
    lease_dir.claim(GpuSample(index=3, uuid="GPU-3", name="H100", pci_bus_id=None),
                    mem_bytes=None, command="holder")
print("held", flush=True)
time.sleep(60)
"""


def start_holder(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_claimed_lease_is_seen_with_who_holds_it(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=5, command="python train.py")
    (seen,) = LeaseDir(tmp_path).leases()
    assert seen == held.lease
    assert (seen.pid, seen.gpu_uuid, seen.command, seen.mem_bytes) == (
        os.getpid(),
        "GPU-3",
        "python train.py",
        5,
    )
    held.release()
    assert LeaseDir(tmp_path).leases() == []


def test_sigkilled_holder_frees_its_gpu_at_once(tmp_path: Path) -> None:
    holder = start_holder(tmp_path)
    assert [lease.pid for lease in LeaseDir(tmp_path).leases()] == [holder.pid]
    # WHEN the holder is killed outright
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    # THEN its lease is gone, and its file is cleaned up by the next locked look
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        assert lease_dir.leases() == []
    assert not list(tmp_path.glob("*.lease"))


def test_lease_passed_to_an_exec_child_lives_as_long_as_the_child(tmp_path: Path) -> None:
    code = f"""
import os, sys
from pathlib import Path
from gpuwatch.leases import LeaseDir
from gpuwatch.models import GpuSample
lease_dir = LeaseDir(Path({str(tmp_path)!r}))
with lease_dir.locked():
    held = lease_dir.claim(GpuSample(index=0, uuid="GPU-0", name=None, pci_bus_id=None),
                           mem_bytes=None, command="sleep")
held.pass_to_child()
os.execvp("sh", ["sh", "-c", "echo ready; exec sleep 60"])
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    assert [lease.pid for lease in LeaseDir(tmp_path).leases()] == [child.pid]
    child.kill()
    child.communicate()
    assert LeaseDir(tmp_path).leases() == []


def test_waiting_line_is_in_arrival_order_and_forgets_the_dead(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    first = lease_dir.enqueue(Request(count=1), "first")
    time.sleep(0.001)
    second = lease_dir.enqueue(Request(count=2), "second")
    assert [w.request.count for w in lease_dir.waiting_before(second)] == [1]
    assert lease_dir.waiting_before(first) == []
    first.release()
    assert lease_dir.waiting_before(second) == []
    second.release()


def hold(path: Path) -> int:
    """Locks `path` as a live holder would (through a symlink, if it is one)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


GOOD = {"gpu_uuid": "GPU-3", "gpu_index": 3, "pid": 77, "command": "x", "started_at": 1.0}


@pytest.mark.parametrize(
    "junk",
    [
        "symlink",
        "fifo",
        "garbage",
        "not-a-dict",
        "huge",
        "deeply-nested",
        "uuid-is-a-list",
        "mem-is-text",
        "index-is-bool",
        "missing-pid",
        "started-past-any-float",
        "started-tomorrow",
    ],
)
def test_junk_in_the_shared_directory_is_ignored(tmp_path: Path, junk: str) -> None:
    # GIVEN a held lease file that is not what it should be, beside a good one
    target = tmp_path / "00000000000000000001-1-x.lease"
    records: dict[str, object] = {
        "uuid-is-a-list": {**GOOD, "gpu_uuid": []},
        "mem-is-text": {**GOOD, "mem_bytes": "1"},
        "index-is-bool": {**GOOD, "gpu_index": True},
        "missing-pid": {key: value for key, value in GOOD.items() if key != "pid"},
        "started-past-any-float": {**GOOD, "started_at": 10**400},
        "started-tomorrow": {**GOOD, "started_at": time.time() + 2 * 86400},
    }
    if junk == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(GOOD))
        target.symlink_to(tmp_path / "elsewhere.json")
    elif junk == "fifo":
        os.mkfifo(target)
    elif junk in records:
        target.write_text(json.dumps(records[junk]))
    else:
        target.write_text(
            {
                "garbage": "{not json",
                "not-a-dict": "[1, 2]",
                "huge": json.dumps({**GOOD, "command": " " * (1 << 20)}),
                "deeply-nested": "[" * 60_000,
            }[junk]
        )
    good = tmp_path / "00000000000000000002-1-y.lease"
    good.write_text(json.dumps(GOOD))
    held = [hold(good)] + ([] if junk == "fifo" else [hold(target)])
    try:
        # THEN only the good lease is seen, and nothing crashes
        assert [lease.gpu_uuid for lease in LeaseDir(tmp_path).leases()] == ["GPU-3"]
    finally:
        for fd in held:
            os.close(fd)


def test_a_lease_whose_command_holds_a_newline_still_holds_its_gpu(tmp_path: Path) -> None:
    # GIVEN a lease for a command whose arguments hold a newline and a tab
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="python train.py --note 'a\nb\tc'")
    # WHEN another process lists the leases THEN the lease is there, command and all
    try:
        (seen,) = LeaseDir(tmp_path).leases()
        assert seen.command == "python train.py --note 'a\nb\tc'"
    finally:
        held.release()


@pytest.mark.parametrize("suffix", ["lease", "wait", "tmp", "x.lease", ""], ids=repr)
def test_other_records_cannot_pose_as_leases_or_tickets(tmp_path: Path, suffix: str) -> None:
    # GIVEN a lease directory WHEN a caller publishes a record under one of its own kinds
    # THEN it is refused, and nothing appears among the leases or the waiting line
    with pytest.raises(ValueError, match="suffix"):
        LeaseDir(tmp_path).publish(suffix, dict(GOOD))
    assert LeaseDir(tmp_path).leases() == []
    assert list(tmp_path.iterdir()) == []


def test_a_published_record_is_read_back_while_held(tmp_path: Path) -> None:
    # GIVEN a record published under a kind of its own
    lease_dir = LeaseDir(tmp_path)
    held = lease_dir.publish("report", {"answer": 42})
    # WHEN it is read while held THEN it comes back, with its owner's uid
    found = lease_dir.read_held(held.path)
    assert found is not None and found[0] == {"answer": 42}
    assert found[1].st_uid == os.getuid()
    # AND once released it reads as gone
    held.release()
    assert LeaseDir(tmp_path).read_held(held.path) is None


def test_a_leases_user_is_its_files_owner_not_what_it_claims(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000001-1-x.lease"
    path.write_text(json.dumps({**GOOD, "user": "somebody-else"}))
    fd = hold(path)
    try:
        (lease,) = LeaseDir(tmp_path).leases()
    finally:
        os.close(fd)
    assert lease.user == pwd.getpwuid(os.getuid()).pw_name
    assert lease.lease_id == "00000000000000000001-1-x"


def test_files_are_readable_by_all_whatever_the_umask(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    old = os.umask(0o077)
    try:
        with lease_dir.locked():
            held = lease_dir.claim(GPU, mem_bytes=None, command="x")
        ticket = lease_dir.enqueue(Request(), "y")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(held.path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(ticket.path).st_mode) == 0o644
    assert not (tmp_path / ".lock").exists(), "the lock is the directory itself"
    held.release()
    ticket.release()


def test_a_dead_draft_is_swept(tmp_path: Path) -> None:
    draft = tmp_path / ".00000000000000000001-1-x.tmp"
    draft.write_text("{")  # left by a picker killed between creating and publishing
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        lease_dir.leases()
    assert not draft.exists()


def test_a_waiter_with_a_huge_command_stays_in_line(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    ticket = lease_dir.enqueue(Request(count=2), "python train.py " + "--flag " * 20_000)
    assert [waiter.request.count for waiter in lease_dir.waiting_before(None)] == [2]
    ticket.release()


def test_a_malformed_ticket_does_not_stop_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "00000000000000000001-1-x.wait"
    bad.write_text(json.dumps({"pid": 5, "request": {"count": 1, "max_util_pct": "x"}}))
    fd = hold(bad)
    try:
        lease_dir = LeaseDir(tmp_path)
        ticket = lease_dir.enqueue(Request(), "me")
        assert lease_dir.waiting_before(ticket) == []
        ticket.release()
    finally:
        os.close(fd)


def test_passing_a_lease_to_a_child_moves_it_out_of_the_way(tmp_path: Path) -> None:
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="x")
    held.pass_to_child()
    assert held.fd >= 512 and os.get_inheritable(held.fd)
    held.release()


def test_a_symlinked_lease_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(LeaseError, match="is not a directory"):
        LeaseDir(tmp_path / "link")


@pytest.mark.parametrize(
    ("parent_mode", "refused"),
    [(0o1777, True), (0o755, False)],
    ids=["in-a-shared-parent", "in-a-root-only-parent"],
)
def test_a_directory_owned_by_another_user(tmp_path: Path, parent_mode: int, refused: bool) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(parent_mode)
    squatted = parent / "gpuwatch"
    squatted.mkdir()
    squatted.chmod(0o1777)
    os.chown(squatted, 54321, 54321)
    if refused:  # its owner could remove anyone's leases
        with pytest.raises(LeaseError, match="belongs to 54321"):
            LeaseDir(squatted)
    else:  # only root could have made it there, as /run/gpuwatch
        LeaseDir(squatted)


def test_a_world_writable_directory_must_be_sticky(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(LeaseError, match="not sticky"):
        LeaseDir(loose)


def test_a_new_directory_is_shared_and_sticky(tmp_path: Path) -> None:
    LeaseDir(tmp_path / "new")
    assert (tmp_path / "new").stat().st_mode & 0o7777 == 0o1777


def test_lease_dir_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(tmp_path))
    assert default_lease_dir() == str(tmp_path)


def test_unwritable_place_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LeaseError, match="GPUWATCH_LEASE_DIR"):
        LeaseDir(tmp_path / "missing" / "deeper")
