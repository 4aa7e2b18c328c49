"""Random lease and ticket files never crash `status`, `pick` or the daemon's lease answers.

Whatever another user writes into the lease directory (and holds, so that it
counts), each held lease file is either shown as a lease or counted as skipped,
and every answer stays strict JSON (no NaN, no Infinity).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.leases.directory import LeaseDir
from tests.helpers.cli import run_cli
from tests.helpers.daemon import running_daemon

pytestmark = pytest.mark.slow

EXTREME_NUMBERS = [10**400, -(10**400), 2**63, 2**53 + 1, 1e300, -1e300, 0, -1, 1]
wild = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EXTREME_NUMBERS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


def maybe(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes anything at all."""
    return st.one_of(plausible, plausible, wild)


UUIDS = st.sampled_from(["GPU-sim-0", "GPU-sim-1", "GPU-00000000-0000-0000-0000-000000000000"])
lease_records = st.fixed_dictionaries(
    {
        "gpu_uuid": maybe(UUIDS),
        "gpu_index": maybe(st.integers(0, 3)),
        "pid": maybe(st.sampled_from([1, os.getpid(), 2**22])),
        "command": maybe(st.text(max_size=30)),
        "started_at": maybe(st.floats(0, 2e9)),
        "mem_bytes": maybe(st.none() | st.integers(0, 1 << 40)),
    }
)
requests = st.fixed_dictionaries(
    {"count": maybe(st.integers(1, 3))},
    optional={
        "min_free_bytes": maybe(st.none() | st.integers(0, 1 << 40)),
        "max_util_pct": maybe(st.none() | st.floats(0, 100)),
        "mem_bytes": maybe(st.none() | st.integers(0, 1 << 40)),
        "strategy": maybe(st.sampled_from(["most-free", "least-util", "pack"])),
        "allowed": maybe(st.none() | st.lists(st.integers(0, 3), max_size=3)),
        "excluded": maybe(st.lists(st.integers(0, 3), max_size=3)),
    },
)
ticket_records = st.fixed_dictionaries(
    {"pid": maybe(st.sampled_from([1, os.getpid()])), "request": maybe(requests)}
)
stems = st.one_of(
    st.integers(0, 10**19).map(lambda n: f"{n:020d}-{os.getpid()}-0badf00d"),
    st.text("0123456789abcdef-", min_size=1, max_size=24),
)
lease_files = st.tuples(stems.map(lambda stem: stem + ".lease"), lease_records | wild)
ticket_files = st.tuples(stems.map(lambda stem: stem + ".wait"), ticket_records | wild)
raw_files = st.tuples(
    stems.flatmap(lambda stem: st.sampled_from([stem + ".lease", stem + ".wait"])),
    st.binary(max_size=64),
)
directories = st.lists(
    st.one_of(lease_files, ticket_files, raw_files), max_size=6, unique_by=lambda f: f[0]
)


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def plant(directory: Path, files: list[tuple[str, object]]) -> list[int]:
    """Writes each file and holds its lock, as a live holder would."""
    held = []
    for name, content in files:
        path = directory / name
        path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    return held


def test_random_lease_and_ticket_files_never_crash_a_reader(
    lease_dir: Path, tmp_path: Path
) -> None:
    with running_daemon(tmp_path) as (_, sock, _):

        @settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(files=directories)
        def check(files: list[tuple[str, object]]) -> None:
            # GIVEN a lease directory holding whatever other users wrote
            shutil.rmtree(lease_dir, ignore_errors=True)
            LeaseDir(lease_dir)
            held = plant(lease_dir, files)
            try:
                # WHEN every reader looks at it
                outcomes = [
                    run_cli("status", "--sim", "2"),
                    run_cli("status", "--sim", "2", "--json"),
                    run_cli("pick", "--sim", "2"),
                    run_cli("pick", "--sim", "2", "--mem", "1GiB"),
                ]
                leases_status, leases_body = http_get(str(sock), "/v1/leases")
                metrics_status, _ = http_get(str(sock), "/metrics")
            finally:
                for fd in held:
                    os.close(fd)
            # THEN nothing crashes, every answer is strict JSON, and each lease file counts
            for result in outcomes:
                assert "unexpected" not in result.stderr, result.stderr
            assert [result.exit_code for result in outcomes[:2]] == [0, 0]
            assert {result.exit_code for result in outcomes[2:]} <= {0, 4}
            strict_json(outcomes[1].stdout)
            assert (leases_status, metrics_status) == (200, 200)
            answer = strict_json(leases_body.decode())
            lease_names = [name for name, _ in files if name.endswith(".lease")]
            assert len(answer["leases"]) + answer["skipped"] == len(lease_names)

        check()


def test_a_held_lease_that_names_its_gpu_holds_it_whatever_else_it_says(lease_dir: Path) -> None:
    @settings(max_examples=200, deadline=None)
    @given(details=st.dictionaries(st.sampled_from(["command", "started_at", "mem_bytes"]), wild))
    def check(details: dict[str, Any]) -> None:
        # GIVEN a held lease on GPU-sim-1 whose start, declaration or command is anything at all
        shutil.rmtree(lease_dir, ignore_errors=True)
        LeaseDir(lease_dir)
        record = {"gpu_uuid": "GPU-sim-1", "gpu_index": 1, "pid": os.getpid(), **details}
        held = plant(lease_dir, [("00000000000000000001-1-0badf00d.lease", record)])
        try:
            # WHEN the leases are read
            found = LeaseDir(lease_dir).read()
        finally:
            for fd in held:
                os.close(fd)
        # THEN it holds its GPU, with every field in range, and is not counted as skipped
        (lease,) = found.leases
        assert (lease.gpu_uuid, found.skipped) == ("GPU-sim-1", 0)
        assert isinstance(lease.command, str) and isinstance(lease.started_at, float)
        assert 0 <= lease.started_at <= time.time()
        assert lease.mem_bytes is None or 0 <= lease.mem_bytes <= 1 << 53

    check()
