"""What another local user can do to the lease directory, and why none of it stops a pick.

The directory is shared by every user: its lock, its waiting tickets and its
lease records are all hostile input.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.errors import NotEnoughGpusError
from gpuwatch.leases import directory as leases
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.leases.locking import flock_within
from gpuwatch.models import Snapshot
from gpuwatch.placement import acquire as selector
from gpuwatch.placement.acquire import acquire
from gpuwatch.placement.wanted import Wanted
from tests.helpers.cli import FROZEN_TIME, CliResult, run_cli
from tests.helpers.other_user import (
    USER,
    as_other_user,
    as_user,
    holding,
    other_user,
    other_user_ids,
    public_lease_dir,
)

pytestmark = pytest.mark.slow

SIM2 = SimBackend(2, clock=lambda: FROZEN_TIME).sample()
UUID = {gpu.index: gpu.uuid for gpu in SIM2.gpus}


@pytest.fixture
def shared_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with public_lease_dir(monkeypatch) as path:
        yield path


def lock_holder(directory: Path, ready: Path) -> list[str]:
    """flock(1) holding `directory`'s lock, touching `ready` once it has it."""
    return ["flock", "--exclusive", str(directory), "sh", "-c", f"touch {ready}; exec sleep 600"]


def plant(directory: Path, name: str, record: object | str) -> int:
    """Writes a lease or ticket file and holds its lock, as a live holder would."""
    path = directory / name
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


class TestDirectoryLock:
    def test_a_held_lock_ends_a_pick_at_its_timeout_naming_the_holder(
        self, lease_dir: Path, tmp_path: Path
    ) -> None:
        # GIVEN another process that took the directory lock and keeps it
        LeaseDir(lease_dir)
        with holding(lock_holder(lease_dir, tmp_path / "ready"), tmp_path / "ready") as holder:
            # WHEN a pick waits at most 1s
            result = run_cli("pick", "--sim", "2", "--allow-busy", "--timeout", "1s")
        # THEN it gives up with exit code 5, saying who holds the lock
        assert result.exit_code == 5, result.stderr
        assert f"stayed locked for 1.0s by pid {holder.pid} (root)" in result.stderr

    def test_a_pick_without_timeout_waits_a_bounded_time(
        self, lease_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # GIVEN a held directory lock, and a default bound shortened for the test
        monkeypatch.setattr(selector, "LOCK_WAIT_S", 0.5)
        LeaseDir(lease_dir)
        with holding(lock_holder(lease_dir, tmp_path / "ready"), tmp_path / "ready"):
            result = run_cli("pick", "--sim", "2", "--allow-busy")
        # THEN a pick without --wait still ends, instead of waiting forever
        assert result.exit_code == 5, result.stderr
        assert "stayed locked for 0.5s" in result.stderr

    def test_a_waiting_pick_outlasts_a_lock_held_past_the_bound(
        self, lease_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # GIVEN a directory lock held past the bound (shortened for the test), twice over
        monkeypatch.setattr(selector, "LOCK_WAIT_S", 0.2)
        go = tmp_path / "go"
        failed_tries = []

        def counting(fd: int, timeout_s: float) -> bool:
            taken = flock_within(fd, timeout_s)
            failed_tries.append(not taken)
            if sum(failed_tries) >= 2:
                go.touch()  # the holder lets go only once the pick waited past the bound twice
            return taken

        monkeypatch.setattr(leases, "flock_within", counting)
        LeaseDir(lease_dir)
        ready = tmp_path / "ready"
        until_go = f"touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done"
        with holding(["flock", "--exclusive", str(lease_dir), "sh", "-c", until_go], ready):
            # WHEN a pick told to wait, with no timeout, meets it
            result = run_cli("pick", "--sim", "2", "--allow-busy", "--wait")
        # THEN it goes on waiting, and gets its GPU once the lock is free
        assert result.exit_code == 0, result.stderr
        assert sum(failed_tries) >= 2 and result.stdout.startswith("GPU-")

    def test_a_lock_held_by_another_user_ends_a_pick_naming_that_user(
        self, shared_dir: Path
    ) -> None:
        user = other_user()
        ready = shared_dir / "ready"
        with holding(as_other_user(lock_holder(shared_dir, ready)), ready) as holder:
            result = run_cli("pick", "--sim", "2", "--allow-busy", "--timeout", "1s")
        assert result.exit_code == 5, result.stderr
        assert f"by pid {holder.pid} ({user.pw_name})" in result.stderr

    def test_the_lock_is_free_while_the_driver_is_read(self, lease_dir: Path) -> None:
        # GIVEN a driver whose every read checks whether the directory lock is free
        lease_dir_ = LeaseDir(lease_dir)
        seen: list[bool] = []

        def check() -> None:
            fd = os.open(lease_dir, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append(True)
            except BlockingIOError:
                seen.append(False)
            finally:
                os.close(fd)

        # WHEN a pick reads it
        wanted = Wanted(selector.Request(allow_busy=True))  # the simulated GPUs are busy
        acquire(_During(check), wanted, lease_dir=lease_dir_, command="x", hold=False)
        # THEN no read happened under the lock: a slow driver keeps no other pick waiting
        assert seen and all(seen)

    @pytest.mark.parametrize(
        ("mem_bytes", "asked_mem_bytes"),
        [(None, None), (None, 1 << 30), (10 << 30, None), (10 << 30, 10 << 30)],
        ids=[
            "exclusive-then-exclusive",
            "exclusive-then-shared",
            "shared-then-exclusive",
            "shared-over-committed",
        ],
    )
    def test_a_claim_made_while_the_driver_was_read_is_respected(
        self, lease_dir: Path, mem_bytes: int | None, asked_mem_bytes: int | None
    ) -> None:
        # GIVEN a one-GPU node (17GiB free), whose only GPU another job claims while this pick
        # reads the driver
        lease_dir_ = LeaseDir(lease_dir)
        gpu = SimBackend(1, clock=lambda: FROZEN_TIME).sample().gpus[0]
        claims = []

        def claim_it() -> None:
            if not claims:
                claims.append(lease_dir_.claim(gpu, mem_bytes=mem_bytes, command="other"))

        # WHEN the pick goes on to choose
        wanted = Wanted(asked=selector.Request(mem_bytes=asked_mem_bytes))
        with pytest.raises(NotEnoughGpusError) as refused:
            acquire(_During(claim_it, gpus=1), wanted, lease_dir=lease_dir_, command="me")
        claims[0].release()
        # THEN it sees that claim: no GPU twice, no memory promised twice
        assert "GPU 0:" in refused.value.reasons[0]


class _During(Backend):
    """A simulated node that runs `hook` in the middle of each read, like a slow driver."""

    name = "sim"

    def __init__(self, hook: Callable[[], None], gpus: int = 2) -> None:
        self._sim = SimBackend(gpus, clock=lambda: FROZEN_TIME)
        self._hook = hook

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        self._hook()
        return self._sim.sample(scope)

    def close(self) -> None:
        self._sim.close()


def ticket(pid: int | str, count: int = 2, **asked: object) -> dict[str, object]:
    """A waiting ticket; on the two-GPU node of these tests, by default for both GPUs."""
    return {"pid": pid, "command": "python train.py", "request": {"count": count, **asked}}


FIRST_IN_LINE = "00000000000000000001-1-0badf00d.wait"


class TestForgedTickets:
    @pytest.mark.parametrize("count", [1000, 2], ids=["1000-gpus", "every-gpu"])
    def test_another_users_ticket_for_pid_1_reserves_nothing(
        self, shared_dir: Path, count: int
    ) -> None:
        # GIVEN another user holding a ticket, first in line, asking GPUs for pid 1 (root's)
        ready = shared_dir / "ready"
        path = shared_dir / FIRST_IN_LINE
        write_and_hold = (
            f"printf '%s' '{json.dumps(ticket(1, count))}' > {path}; "
            f"exec flock {path} sh -c 'touch {ready}; exec sleep 600'"
        )
        with holding(as_other_user(["sh", "-c", write_and_hold]), ready):
            # WHEN this user picks a GPU
            result = run_cli("pick", "--sim", "2", "--allow-busy")
        # THEN it gets one: the ticket was not believed
        assert result.exit_code == 0, result.stderr

    @pytest.mark.parametrize(
        ("name", "record"),
        [
            (FIRST_IN_LINE, ticket(1)),
            (FIRST_IN_LINE, ticket(2**22)),
            (FIRST_IN_LINE, ticket(0)),
            (FIRST_IN_LINE, ticket(-5)),
            ("99999999999999999999-1-0badf00d.wait", ticket("own")),
            ("0-1-x.wait", ticket("own")),
            (FIRST_IN_LINE, ticket("own", 3)),
            (FIRST_IN_LINE, ticket("own", max_util_pct=1e999)),
            (FIRST_IN_LINE, ticket("own", max_util_pct=101)),
            (FIRST_IN_LINE, ticket("own", excluded=[2**70])),
        ],
        ids=[
            "pid-1-that-does-not-hold-it",
            "pid-that-does-not-exist",
            "pid-0",
            "negative-pid",
            "dated-in-the-future",
            "name-out-of-order",
            "more-gpus-than-the-node-has",
            "infinite-percent",
            "percent-over-100",
            "huge-index",
        ],
    )
    def test_a_ticket_that_cannot_be_believed_keeps_no_gpu(
        self, lease_dir: Path, name: str, record: dict[str, object]
    ) -> None:
        # GIVEN a ticket first in line, for both GPUs, that is forged, dead or asks the impossible
        LeaseDir(lease_dir)
        if record["pid"] == "own":
            record = {**record, "pid": os.getpid()}  # alive, this user's, and holding it
        fd = plant(lease_dir, name, record)
        try:
            result = run_cli("pick", "--sim", "2", "--allow-busy")
        finally:
            os.close(fd)
        # THEN a pick behind it is served
        assert result.exit_code == 0, result.stderr

    def test_a_ticket_naming_a_live_process_that_does_not_hold_it_keeps_no_gpu(
        self, lease_dir: Path, tmp_path: Path
    ) -> None:
        # GIVEN a ticket naming this (live, same-user) process, held by another process
        LeaseDir(lease_dir)
        path = lease_dir / FIRST_IN_LINE
        path.write_text(json.dumps(ticket(os.getpid(), 2)))
        ready = tmp_path / "ready"
        with holding(["flock", str(path), "sh", "-c", f"touch {ready}; exec sleep 600"], ready):
            result = run_cli("pick", "--sim", "2", "--allow-busy")
        assert result.exit_code == 0, result.stderr

    def test_a_real_waiter_still_keeps_its_gpus(self, lease_dir: Path) -> None:
        # GIVEN a job really waiting for both GPUs of the node
        lease_dir_ = LeaseDir(lease_dir)
        waiting = lease_dir_.enqueue(selector.Request(count=2, allow_busy=True), "python big.py")
        try:
            result = run_cli("pick", "--sim", "2", "--allow-busy")
        finally:
            waiting.release()
        # THEN a later job is kept off them, and told why
        assert result.exit_code == 4
        assert f"kept for pid {os.getpid()} (root), which asked earlier" in result.stderr


ODD_DETAILS = {
    "started-at-1e300": ("started_at", 1e300),
    "started-at-nan": ("started_at", float("nan")),
    "started-at-infinity": ("started_at", float("inf")),
    "started-at-negative": ("started_at", -1.0),
    "started-at-huge-int": ("started_at", 10**400),
    "mem-10-to-the-400": ("mem_bytes", 10**400),
    "mem-negative": ("mem_bytes", -1),
    "mem-float": ("mem_bytes", 1.5),
    "command-not-text": ("command", ["rm", "-rf"]),
}
"""Fields that say neither which GPU is held nor by whom: a held lease holds it anyway."""

GPUWATCH = [sys.executable, "-m", "gpuwatch"]

BAD_VALUES = {
    "index-negative": ("gpu_index", -1),
    "index-huge": ("gpu_index", 2**40),
    "pid-zero": ("pid", 0),
    "pid-huge": ("pid", 2**63),
    "uuid-empty": ("gpu_uuid", ""),
    "uuid-huge": ("gpu_uuid", "G" * 10_000),
}


def lease_record(**changes: object) -> dict[str, object]:
    record: dict[str, object] = {
        "gpu_uuid": UUID[0],
        "gpu_index": 0,
        "pid": os.getpid(),
        "command": "python train.py",
        "started_at": FROZEN_TIME,
        "mem_bytes": 1 << 30,
    }
    return {**record, **changes}


def strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def status_and_shared_pick_beside(
    lease_dir: Path, field: str, value: object
) -> tuple[CliResult, CliResult, CliResult]:
    """`status -v`, `status --json` and a pick sharing GPU 0, while a held lease on GPU 0
    says `field` = `value`."""
    fd = plant(lease_dir, "00000000000000000001-1-0badf00d.lease", lease_record(**{field: value}))
    try:
        return (
            run_cli("status", "--sim", "2", "-v"),
            run_cli("status", "--sim", "2", "--json"),
            run_cli("pick", "--sim", "2", "--mem", "1GiB", "--exclude", "1", "-v"),
        )
    finally:
        os.close(fd)


class TestExtremeRecords:
    @pytest.mark.parametrize(("field", "value"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
    def test_a_planted_record_is_skipped_by_status_and_pick(
        self, lease_dir: Path, field: str, value: object
    ) -> None:
        # GIVEN a held lease file on GPU 0 with one field out of range
        LeaseDir(lease_dir)
        # (json.dumps writes NaN, Infinity and 400-digit numbers, as a forger may)
        table, as_json, pick = status_and_shared_pick_beside(lease_dir, field, value)
        # THEN status shows no lease and says (with -v) it skipped one file
        assert table.exit_code == 0, table.stderr
        assert "leased by" not in table.stdout
        assert "skipped 1 malformed file(s) in the lease directory" in table.stderr
        assert as_json.exit_code == 0 and strict_json(as_json.stdout)["leases"] == []  # type: ignore[index]
        # AND a pick sharing GPU 0 is served, as if the record were absent, and says so with -v
        assert pick.exit_code == 0, pick.stderr
        assert "skipped 1 malformed file(s) in the lease directory" in pick.stderr

    @pytest.mark.parametrize(("field", "value"), ODD_DETAILS.values(), ids=ODD_DETAILS.keys())
    def test_a_held_record_with_an_odd_detail_still_holds_its_gpu(
        self, lease_dir: Path, field: str, value: object
    ) -> None:
        # GIVEN a held lease file on GPU 0 (shared, 1GiB) whose start, declaration or
        # command is out of range: as after the clock stepped back, or from a forger
        LeaseDir(lease_dir)
        table, as_json, pick = status_and_shared_pick_beside(lease_dir, field, value)
        # THEN status shows the lease, in JSON with nothing out of range
        assert table.exit_code == 0, table.stderr
        assert "leased by" in table.stdout and "skipped" not in table.stderr
        (lease,) = strict_json(as_json.stdout)["leases"]  # type: ignore[index]
        assert 0 <= lease["started_at"] <= time.time()
        # AND GPU 0 is still held: shared as declared, or whole when the declaration is unreadable
        if field == "mem_bytes":
            assert lease["mem_bytes"] is None and pick.exit_code == ExitCode.NOT_ENOUGH_GPUS
        else:
            assert lease["mem_bytes"] == 1 << 30 and pick.exit_code == 0, pick.stderr

    def test_another_users_planted_record_is_skipped(self, shared_dir: Path) -> None:
        # GIVEN another user holding a lease file whose GPU index is negative
        ready = shared_dir / "ready"
        path = shared_dir / "00000000000000000001-1-0badf00d.lease"
        record = json.dumps(lease_record(gpu_index=-1, pid=1))
        write_and_hold = (
            f"printf '%s' '{record}' > {path}; "
            f"exec flock {path} sh -c 'touch {ready}; exec sleep 600'"
        )
        with holding(as_other_user(["sh", "-c", write_and_hold]), ready):
            table = run_cli("status", "--sim", "2", "-v")
            pick = run_cli("pick", "--sim", "2", "--mem", "1GiB", "--exclude", "1")
        # THEN this user's status and pick go on as if it were absent
        assert table.exit_code == 0, table.stderr
        assert "skipped 1 malformed file(s)" in table.stderr
        assert pick.exit_code == 0, pick.stderr

    def test_the_daemon_answers_and_counts_skipped_records(
        self, lease_dir: Path, tmp_path: Path
    ) -> None:
        from gpuwatch.backends.daemon_client import http_get
        from tests.helpers.daemon import running_daemon

        LeaseDir(lease_dir)
        fds = [
            plant(lease_dir, f"{n:020d}-1-0badf00d.lease", lease_record(**{field: value}))
            for n, (field, value) in enumerate(BAD_VALUES.values())
        ]
        try:
            with running_daemon(tmp_path) as (_, sock, _):
                leases_status, leases = http_get(str(sock), "/v1/leases")
                metrics_status, metrics = http_get(str(sock), "/metrics")
        finally:
            for fd in fds:
                os.close(fd)
        assert leases_status == 200
        assert strict_json(leases.decode()) == {"leases": [], "skipped": len(BAD_VALUES)}
        assert metrics_status == 200 and b"gpuwatch_leases" in metrics


class TestHeldVariable:
    def test_another_users_lease_named_in_gpuwatch_held_is_still_theirs(
        self, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # GIVEN another user holding an exclusive lease on the only GPU
        ready = shared_dir / "ready"
        lease_id = "00000000000000000001-1-0badf00d"
        path = shared_dir / f"{lease_id}.lease"
        record = json.dumps(lease_record(pid=1, mem_bytes=None))
        write_and_hold = (
            f"printf '%s' '{record}' > {path}; "
            f"exec flock {path} sh -c 'touch {ready}; exec sleep 600'"
        )
        with holding(as_other_user(["sh", "-c", write_and_hold]), ready):
            # WHEN this user's pick claims that lease as its own job's, through GPUWATCH_HELD
            monkeypatch.setenv("GPUWATCH_HELD", lease_id)
            result = run_cli("pick", "--sim", "1", "--allow-busy")
        # THEN the GPU stays the other user's: only one's own leases are passed down
        assert result.exit_code == 4, result.stderr
        assert f"leased by pid 1 ({other_user().pw_name})" in result.stderr


class TestSecondUser:
    """The quick start on a machine where no administrator made the shared directory."""

    def test_the_quick_start_works_for_the_second_user_of_a_machine(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        uid, gid = other_user_ids()
        with public_lease_dir(monkeypatch) as parent:
            shared = parent / "gpuwatch"
            monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(shared))
            ready = parent / "ready"
            # GIVEN another user's quick start, which made the lease directory, holding a GPU
            theirs = as_user(
                uid, gid, *GPUWATCH, "pick", "--sim", "8", "--", "sh", "-c",
                f"touch {ready}; exec sleep 600",
            )  # fmt: skip
            with holding(theirs, ready):
                # WHEN this user runs the quick start too
                mine = subprocess.run(
                    [
                        *GPUWATCH,
                        "pick",
                        "--sim",
                        "8",
                        "--",
                        "sh",
                        "-c",
                        "echo $CUDA_VISIBLE_DEVICES",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                (their_lease,) = LeaseDir(shared).leases()
        # THEN the job runs, on the GPU the other user does not hold, with one line naming
        # who could tamper with the leases (before the one naming the GPU chosen)
        assert mine.returncode == 0, mine.stderr
        said = mine.stderr.splitlines()
        assert len(said) == 2 and said[1].startswith("gpuwatch: chose GPU")
        assert f"lets {USER} remove or forge" in said[0]
        assert their_lease.user == USER and mine.stdout.strip() not in ("", their_lease.gpu_uuid)

    def test_a_directory_the_second_user_cannot_write_gives_a_pick_without_a_lease(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        uid, gid = other_user_ids()
        with public_lease_dir(monkeypatch) as parent:
            # GIVEN a lease directory made by another user (root here) that only they may write
            shared = parent / "gpuwatch"
            shared.mkdir(mode=0o755)
            env = {**os.environ, "GPUWATCH_LEASE_DIR": str(shared)}
            # WHEN this user (the other user here) runs the quick start
            picked = subprocess.run(
                as_user(uid, gid, *GPUWATCH, "pick", "--sim", "8", "--", "true"),
                env=env,
                capture_output=True,
                text=True,
                check=False,
                cwd="/",
            )
            # THEN the job runs, without a lease, said in one line (before the one naming the
            # GPU chosen); the directory is untouched
            assert picked.returncode == 0, picked.stderr
            said = picked.stderr.splitlines()
            assert len(said) == 2 and said[1].startswith("gpuwatch: chose GPU")
            assert said[0].startswith("gpuwatch: picking without a lease")
            assert list(shared.iterdir()) == []

    def test_leases_in_a_directory_the_second_user_cannot_write_are_still_shown(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        uid, gid = other_user_ids()
        with public_lease_dir(monkeypatch) as parent:
            # GIVEN a lease directory only its maker (root here) may write, holding a lease
            shared = parent / "gpuwatch"
            shared.mkdir(mode=0o755)
            lease_dir = LeaseDir(shared)
            with lease_dir.locked():
                held = lease_dir.claim(
                    SimBackend(2).sample().gpus[0], mem_bytes=None, command="train"
                )
            # WHEN another user looks
            try:
                shown = subprocess.run(
                    as_user(uid, gid, *GPUWATCH, "status", "--sim", "2", "--json"),
                    env={**os.environ, "GPUWATCH_LEASE_DIR": str(shared)},
                    capture_output=True,
                    text=True,
                    check=False,
                    cwd="/",
                )
            finally:
                held.release()
        # THEN the lease is shown: looking needs no write
        assert shown.returncode == 0, shown.stderr
        assert [lease["command"] for lease in json.loads(shown.stdout)["leases"]] == ["train"]
