"""Leases across real processes: held while the holder lives, gone the moment it dies."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from gpuwatch import paths
from gpuwatch.backends.base import SampleScope
from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.errors import DaemonUnavailableError, LeaseError, WaitTimeoutError
from gpuwatch.leases.directory import LeaseDir, Unleased, default_lease_dir
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.placement.acquire import acquire
from gpuwatch.placement.wanted import Wanted
from gpuwatch.request import Request
from tests.helpers.cli import run_cli
from tests.helpers.daemon import running_daemon
from tests.helpers.fake_nvml import FakeGpu, FakeNvml
from tests.helpers.files import what_is_at
from tests.helpers.wait import wait_until

GPU = GpuSample(index=3, uuid="GPU-3", name="H100", pci_bus_id=None)

HOLDER = """
import sys, time
from pathlib import Path
from gpuwatch.leases.directory import LeaseDir
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
from gpuwatch.leases.directory import LeaseDir
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
    stamped_by = time.time_ns()  # tickets are stamped with the clock: the next one later
    wait_until(lambda: time.time_ns() > stamped_by, "the clock to move on")
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
        "index-is-bool",
        "missing-pid",
    ],
)
def test_junk_in_the_shared_directory_is_ignored(tmp_path: Path, junk: str) -> None:
    # GIVEN a held lease file that is not what it should be, beside a good one
    target = tmp_path / "00000000000000000001-1-x.lease"
    records: dict[str, object] = {
        "uuid-is-a-list": {**GOOD, "gpu_uuid": []},
        "index-is-bool": {**GOOD, "gpu_index": True},
        "missing-pid": {key: value for key, value in GOOD.items() if key != "pid"},
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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("started_at", time.time() + 2 * 86400),  # written before the clock stepped back a day
        ("started_at", 10**400),
        ("started_at", None),
        ("mem_bytes", "1"),
        ("mem_bytes", -1),
        ("command", ["rm", "-rf"]),
    ],
    ids=[
        "started-tomorrow",
        "started-past-any-float",
        "started-null",
        "mem-is-text",
        "mem-negative",
        "command-is-a-list",
    ],
)
def test_a_held_lease_holds_its_gpu_whatever_its_other_fields_say(
    tmp_path: Path, field: str, value: object
) -> None:
    # GIVEN a held lease on GPU-3 whose record says something odd besides which GPU
    target = tmp_path / "00000000000000000001-1-x.lease"
    target.write_text(json.dumps({**GOOD, field: value}))
    fd = hold(target)
    try:
        # WHEN the leases are read
        leases = LeaseDir(tmp_path).leases()
    finally:
        os.close(fd)
    # THEN it still holds GPU-3, exclusively when its declaration cannot be read,
    # and dated no later than now
    assert [lease.gpu_uuid for lease in leases] == ["GPU-3"]
    assert leases[0].started_at <= time.time()
    if field == "mem_bytes":
        assert leases[0].exclusive


def test_a_lease_whose_command_holds_a_newline_still_holds_its_gpu(tmp_path: Path) -> None:
    # GIVEN a lease for a command whose arguments hold a newline and a tab
    lease_dir = LeaseDir(tmp_path)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="python train.py --note 'a\nb\tc'")
    # WHEN another process lists the leases THEN the lease is there, its command made
    # printable as all text that enters the model is
    try:
        (seen,) = LeaseDir(tmp_path).leases()
        assert seen.command == "python train.py --note 'a?b?c'"
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


@pytest.mark.parametrize(
    ("parent_mode", "warned"),
    [(0o1777, True), (0o755, False)],
    ids=["in-a-shared-parent", "in-a-root-only-parent"],
)
def test_a_directory_owned_by_another_user(tmp_path: Path, parent_mode: int, warned: bool) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(parent_mode)
    theirs = parent / "gpuwatch"
    theirs.mkdir()
    theirs.chmod(0o1777)
    os.chown(theirs, 54321, 54321)
    warning = LeaseDir(theirs).warning
    if warned:  # its owner could remove anyone's leases
        assert warning is not None and "lets 54321 remove or forge leases" in warning
    else:  # only root could have made it there, as /run/gpuwatch
        assert warning is None


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


@pytest.mark.parametrize("kind", ["symlink", "regular-file", "fifo"])
def test_a_lease_dir_that_is_no_directory_is_refused_and_left_as_it_is(
    tmp_path: Path, kind: str
) -> None:
    # GIVEN GPUWATCH_LEASE_DIR naming a symlink (to a directory), a regular file or a FIFO
    target = tmp_path / "leases"
    if kind == "symlink":
        (tmp_path / "real").mkdir()
        target.symlink_to(tmp_path / "real")
    elif kind == "regular-file":
        target.write_text("precious")
    else:
        os.mkfifo(target)
    before = what_is_at(target)
    # WHEN a job is picked, and the leases are shown
    picked = run_cli("pick", "--sim", "2", "--allow-busy", env={"GPUWATCH_LEASE_DIR": str(target)})
    shown = run_cli("status", "--sim", "2", "-v", env={"GPUWATCH_LEASE_DIR": str(target)})
    # THEN pick is refused in one line naming what is there, a usage error; status shows the
    # GPUs and says why no lease is shown; and nothing at that path has changed
    what = {"symlink": "a symlink", "regular-file": "a regular file", "fifo": "a FIFO"}[kind]
    assert picked.exit_code == ExitCode.USAGE
    assert picked.stderr.count("\n") == 1 and f"is {what}, not a directory" in picked.stderr
    assert shown.exit_code == 0 and "leases are not shown" in shown.stderr
    assert what_is_at(target) == before
    assert kind != "regular-file" or target.read_text() == "precious"
    assert kind != "symlink" or list((tmp_path / "real").iterdir()) == []


def test_an_unusable_default_directory_gives_a_pick_without_a_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no GPUWATCH_LEASE_DIR, no system directory, and a FIFO where /tmp/gpuwatch would be
    fallback = tmp_path / "gpuwatch"
    os.mkfifo(fallback)
    monkeypatch.setattr(paths, "SYSTEM_LEASE_DIR", str(tmp_path / "no-system-dir"))
    monkeypatch.setattr(paths, "FALLBACK_LEASE_DIR", str(fallback))
    monkeypatch.delenv("GPUWATCH_LEASE_DIR")
    # WHEN a job is picked
    said: list[str] = []
    lease_dir = LeaseDir.for_job(say=said.append)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="x")
    held.pass_to_child()
    held.release()
    # THEN it is picked without a lease, said in one line, and the FIFO is left as it was
    assert isinstance(lease_dir, Unleased) and lease_dir.leases() == []
    assert len(said) == 1 and said[0].startswith("picking without a lease")
    assert stat.S_ISFIFO(os.lstat(fallback).st_mode)


def test_another_users_directory_is_used_with_a_warning_naming_them(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    # GIVEN a shared directory that another user (uid 54321) made in a shared parent
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o1777)
    theirs = parent / "gpuwatch"
    theirs.mkdir()
    theirs.chmod(0o1777)
    os.chown(theirs, 54321, 54321)
    # WHEN a job is picked there
    said: list[str] = []
    lease_dir = LeaseDir.for_job(theirs, say=said.append)
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="x")
    # THEN the lease is held there, with one warning naming who could tamper with it
    assert [lease.lease_id for lease in lease_dir.leases()] == [held.lease.lease_id]
    assert len(said) == 1 and "lets 54321 remove or forge leases" in said[0]
    held.release()


def test_a_world_writable_directory_that_is_not_sticky_is_used_with_a_warning(
    tmp_path: Path,
) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    said: list[str] = []
    lease_dir = LeaseDir.for_job(loose, say=said.append)
    assert not isinstance(lease_dir, Unleased)
    assert len(said) == 1 and "lets every user remove or forge leases" in said[0]
    assert "chmod +t" in said[0]
    assert loose.stat().st_mode & 0o7777 == 0o777  # warned about, not altered


def test_a_short_write_still_publishes_the_whole_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a disk that takes at most 7 bytes per write, as a nearly full one may
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    lease_dir = LeaseDir(tmp_path)
    # WHEN a lease is claimed
    with lease_dir.locked():
        held = lease_dir.claim(GPU, mem_bytes=None, command="a long command " * 10)
    monkeypatch.undo()
    # THEN the whole record is there: the lease holds its GPU
    assert [lease.gpu_uuid for lease in LeaseDir(tmp_path).leases()] == ["GPU-3"]
    held.release()


def test_a_write_that_cannot_complete_fails_the_claim_with_a_lease_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a disk that fills up after a few bytes of the record
    written: list[int] = []

    def filling(fd: int, data: bytes) -> int:
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(real_write(fd, bytes(data[:10])))
        return written[0]

    real_write = os.write
    lease_dir = LeaseDir(tmp_path)
    monkeypatch.setattr(os, "write", filling)
    # WHEN a lease is claimed
    with pytest.raises(LeaseError, match="No space left on device") as raised, lease_dir.locked():
        lease_dir.claim(GPU, mem_bytes=None, command="x")
    monkeypatch.undo()
    # THEN it is a clear lease error, and no part of the record is left behind
    assert "cannot write a lease in" in str(raised.value)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A lease directory on a small tmpfs with no space left."""
    if os.getuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        (mount / "leases").mkdir(mode=0o1777)
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        yield mount / "leases"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_pick_on_a_full_disk_fails_with_one_clear_lease_error(full_disk: Path) -> None:
    # GIVEN a lease directory on a disk with no space left
    env = {**os.environ, "GPUWATCH_LEASE_DIR": str(full_disk)}
    # WHEN a job is picked, from the command line and through select()
    picked = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "pick", "--sim", "8", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    selected = subprocess.run(
        [sys.executable, "-c", "import gpuwatch; gpuwatch.select(sim='8')"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    # THEN pick says so in one line, select() raises a LeaseError, and no file is left
    assert picked.returncode == ExitCode.FAILED
    assert picked.stderr.count("\n") == 1, picked.stderr
    assert "cannot write a lease in" in picked.stderr and "No space left" in picked.stderr
    assert "gpuwatch.errors.LeaseError: cannot write a lease in" in selected.stderr
    assert list(full_disk.iterdir()) == []


TWO_GPUS = 'hostname = "daemon-node"\n[[gpu]]\ncount = 2\nload = "constant"\nutilization_pct = 10\n'


@pytest.mark.slow
class TestWaitersOutliveTheDaemon:
    """Jobs in `pick --wait` keep their place while the daemon restarts or hangs."""

    @pytest.fixture
    def jobs(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Jobs]:
        monkeypatch.setenv("GPUWATCH_SOCKET", str(tmp_path / "gpuwatch.sock"))
        started = Jobs(tmp_path)
        yield started
        for process in started.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()

    def test_waiters_go_on_through_a_daemon_restart_and_get_gpus(
        self, tmp_path: Path, lease_dir: Path, jobs: Jobs
    ) -> None:
        # GIVEN a daemon, a job holding both GPUs, and two jobs waiting (auto and daemon backend)
        with running_daemon(tmp_path, scenario=TWO_GPUS):
            jobs.holder()
            waiters = jobs.two_waiters_in_line(lease_dir)
        # WHEN the daemon stops (the waiters find no daemon, nor a driver, for a while)
        # and starts again, and then the GPUs are given back
        looked_again(waiters)
        assert [waiter.poll() for waiter in waiters] == [None, None]
        with running_daemon(tmp_path, scenario=TWO_GPUS):
            jobs.release()
            codes = jobs.finish(waiters)
        # THEN both waiters went on, and got a GPU each
        assert codes == [0, 0], jobs.errors()
        assert sorted(jobs.gpus_of_waiters()) == sorted(jobs.gpus_of_holder())

    def test_waiters_go_on_through_a_hung_daemon(
        self, tmp_path: Path, lease_dir: Path, jobs: Jobs
    ) -> None:
        # GIVEN a daemon, a job holding both GPUs, and two jobs waiting (auto and daemon backend)
        with running_daemon(tmp_path, scenario=TWO_GPUS) as (daemon, _, _):
            jobs.holder()
            waiters = jobs.two_waiters_in_line(lease_dir)
            # WHEN the daemon hangs past the time a client waits for an answer (2s)
            daemon.send_signal(signal.SIGSTOP)
            try:
                looked_again(waiters)
                hung = [waiter.poll() for waiter in waiters]
                jobs.release()
            finally:
                daemon.send_signal(signal.SIGCONT)
            codes = jobs.finish(waiters)
        # THEN the waiters were still waiting, went on when it answered again, and got GPUs
        assert hung == [None, None]
        assert codes == [0, 0], jobs.errors()
        assert sorted(jobs.gpus_of_waiters()) == sorted(jobs.gpus_of_holder())


def looked_again(waiters: list[subprocess.Popen[str]]) -> None:
    """Waits until each waiter has gone back to waiting three more times, as the kernel
    counts its voluntary context switches: whatever it was doing, it has since made a whole
    round of looking (given up on a hung daemon's answer after its timeout, or found none)."""
    before = [_waits(waiter.pid) for waiter in waiters]
    wait_until(
        lambda: all(
            waiter.poll() is not None or _waits(waiter.pid) >= count + 3
            for waiter, count in zip(waiters, before, strict=True)
        ),
        "the waiters to look for the daemon again",
        timeout_s=60,
    )


def _waits(pid: int) -> int:
    return int(psutil.Process(pid).num_ctx_switches().voluntary)


class Jobs:
    """`gpuwatch pick` jobs in their own process groups: one holder of both GPUs, and waiters."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.go = tmp_path / "go"
        self.done = tmp_path / "done"
        self.processes: list[subprocess.Popen[str]] = []
        self._notes: list[Path] = []

    def holder(self) -> None:
        note = self.tmp_path / "holder.gpus"
        self._start("-n", "2", "--", "sh", "-c", self._script(note, hold=True))
        wait_until(note.exists, "the holder to start", timeout_s=60, interval_s=0.02)

    def waiter(self, *options: str) -> subprocess.Popen[str]:
        note = self.tmp_path / f"waiter-{len(self._notes)}.gpus"
        self._notes.append(note)
        return self._start(
            "--wait", "--timeout", "60", *options, "--", "sh", "-c", self._script(note)
        )

    def two_waiters_in_line(self, lease_dir: Path) -> list[subprocess.Popen[str]]:
        """Two jobs waiting for GPUs, one through the auto backend, one through the daemon's,
        once both have their ticket in line."""
        waiters = [self.waiter(), self.waiter("--backend", "daemon")]
        wait_until(
            lambda: len(list(lease_dir.glob("*.wait"))) == 2,
            "both jobs to queue",
            timeout_s=60,
            interval_s=0.02,
        )
        return waiters

    def release(self) -> None:
        self.go.touch()

    def finish(self, waiters: list[subprocess.Popen[str]]) -> list[int | None]:
        """Exit codes of the waiters, once each holds its GPU (all at once) and ends."""
        wait_until(
            lambda: (
                all(note.exists() for note in self._notes)
                or any(waiter.poll() for waiter in waiters)
            ),
            "the waiters to run",
            timeout_s=60,
            interval_s=0.02,
        )
        self.done.touch()
        return [waiter.wait(timeout=60) for waiter in waiters]

    def gpus_of_holder(self) -> list[str]:
        return (self.tmp_path / "holder.gpus").read_text().strip().split(",")

    def gpus_of_waiters(self) -> list[str]:
        return [note.read_text().strip() for note in self._notes]

    def errors(self) -> list[str]:
        return [process.stderr.read() if process.stderr else "" for process in self.processes]

    def _script(self, note: Path, *, hold: bool = False) -> str:
        until = self.go if hold else self.done
        return f'echo "$CUDA_VISIBLE_DEVICES" > {note}; while [ ! -e {until} ]; do sleep 0.05; done'

    def _start(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "pick", "--allow-busy", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.processes.append(process)
        return process


def test_select_in_an_unusable_default_directory_warns_and_holds_no_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_nvml: Callable[..., FakeNvml]
) -> None:
    import gpuwatch
    from gpuwatch.placement import selection as selection_module

    # GIVEN no GPUWATCH_LEASE_DIR, no system directory, and a regular file where
    # /tmp/gpuwatch would be
    fallback = tmp_path / "gpuwatch"
    fallback.write_text("not a directory")
    monkeypatch.setattr(paths, "SYSTEM_LEASE_DIR", str(tmp_path / "no-system-dir"))
    monkeypatch.setattr(paths, "FALLBACK_LEASE_DIR", str(fallback))
    monkeypatch.delenv("GPUWATCH_LEASE_DIR")
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUWATCH_HELD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    # WHEN a script selects a GPU of this machine (a simulated node's leases live apart)
    fake_nvml(FakeGpu(utilization=0))
    try:
        with pytest.warns(RuntimeWarning, match="picking without a lease"):
            selected = gpuwatch.select(backend="nvml")
        # THEN it has one, holds no lease, and the file is left as it was
        assert len(selected.gpus) == 1 and selected.environment.get("GPUWATCH_HELD", "") == ""
        assert fallback.read_text() == "not a directory"
    finally:
        if selection_module._this_process.selection is not None:
            selection_module._this_process.selection.release()


class _ResetDaemon(SimBackend):
    """A daemon whose first `failures` answers are cut off, as by a restart."""

    name = "daemon"

    def __init__(self, failures: int) -> None:
        super().__init__(8)  # GPUs 3 and 7 idle
        self.failures = failures

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        if self.failures:
            self.failures -= 1
            raise DaemonUnavailableError("the daemon at x.sock failed: Connection reset by peer")
        return super().sample(scope)


@pytest.mark.parametrize(
    ("wait", "timeout_s", "outcome"),
    [(True, None, "chosen"), (False, None, DaemonUnavailableError), (True, 0.0, WaitTimeoutError)],
    ids=["waiting-goes-on", "not-waiting-fails-at-once", "waiting-ends-at-its-timeout"],
)
def test_a_connection_reset_ends_only_a_job_that_does_not_wait(
    tmp_path: Path, wait: bool, timeout_s: float | None, outcome: object
) -> None:
    # GIVEN a daemon whose next answers are cut off by its restart
    backend = _ResetDaemon(failures=3)
    run = functools.partial(
        acquire,
        backend,
        Wanted(),
        lease_dir=LeaseDir(tmp_path),
        command="x",
        hold=False,
        wait=wait,
        timeout_s=timeout_s,
        sleep=lambda _: None,
    )
    # WHEN a job asks for a GPU THEN only a waiting one with time left goes on, and gets it
    if outcome == "chosen":
        chosen, _ = run()
        assert len(chosen) == 1 and backend.failures == 0
    else:
        with pytest.raises(outcome, match="Connection reset by peer"):  # type: ignore[call-overload]
            run()
