"""Every backend keeps the same promises: a Snapshot of the promised types, in both scopes."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from gpuwatch.backends import open_backend
from gpuwatch.backends.auto import AutoBackend
from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.daemon_client import DaemonBackend
from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import GpuSample, MigDevice, ProcessUsage, Snapshot
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.daemon import running_daemon
from tests.helpers.fake_nvml import FakeGpu, FakeNvml, mig_gpu

SCENARIO = """
[[gpu]]
model = "A100-40GB"
load = "sine"
utilization_pct = [10, 90]
unsupported = ["fan_pct", "power_w"]

[[gpu]]
fault = "lost"

[[gpu]]
model = "A100-80GB"
mig = ["3g.40gb", "1g.10gb"]

[[process]]
gpu = 0
pid = 7
memory = "3GiB"
kind = "compute+graphics"

[[process]]
gpu = 2
mig = 1
pid = 8
memory = "1GiB"
"""


@pytest.fixture(scope="module")
def daemon_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real daemon serving the scenario above, for the daemon and auto backends."""
    home = tmp_path_factory.mktemp("contract-daemon")
    env = {"GPUWATCH_LEASE_DIR": str(home / "leases")}
    with running_daemon(home, env=env, scenario=SCENARIO) as (_, socket_path, _):
        yield socket_path


@pytest.fixture(params=["sim-count", "sim-file", "nvml", "daemon", "auto"])
def backend(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    fake_nvml: Callable[..., FakeNvml],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Backend]:
    if request.param == "sim-count":
        opened: Backend = SimBackend(4, clock=lambda: FROZEN_TIME)
    elif request.param == "sim-file":
        path = tmp_path / "node.toml"
        path.write_text(SCENARIO)
        opened = SimBackend(path, clock=lambda: FROZEN_TIME)
    elif request.param == "daemon":
        opened = DaemonBackend(str(request.getfixturevalue("daemon_socket")))
    elif request.param == "auto":
        # As users open it: the daemon when one answers at the configured socket.
        monkeypatch.setenv("GPUWATCH_SOCKET", str(request.getfixturevalue("daemon_socket")))
        opened = open_backend("auto")
        assert isinstance(opened, AutoBackend) and opened.name == "daemon"
    else:
        fake_nvml(
            FakeGpu(compute=[(11, 1 << 30)], graphics=[(11, 1 << 30), (12, 2 << 30)]),
            FakeGpu(uuid="GPU-lost", lost=True),
            FakeGpu(uuid="GPU-quiet", unsupported={"fan", "power", "temperature"}),
            mig_gpu(3, ("3g.40gb", "1g.10gb")),
        )
        opened = NvmlBackend()
    with opened:
        yield opened


def _assert_fields_match_annotations(value: object) -> None:
    hints = typing.get_type_hints(type(value))
    for field in msgspec.structs.fields(value):  # type: ignore[arg-type]
        expected = hints[field.name]
        allowed = (
            typing.get_args(expected) if isinstance(expected, types.UnionType) else (expected,)
        )
        actual = getattr(value, field.name)
        assert any(isinstance(actual, typing.get_origin(kind) or kind) for kind in allowed), (
            f"{type(value).__name__}.{field.name} = {actual!r} is not {expected}"
        )


def test_full_sample_has_promised_types(backend: Backend) -> None:
    # GIVEN an open backend WHEN it is sampled in full
    snapshot = backend.sample(SampleScope.FULL)
    # THEN every field of every record has its declared type
    assert isinstance(snapshot, Snapshot)
    _assert_fields_match_annotations(snapshot)
    assert snapshot.gpus, "a backend that opened reports at least one GPU"
    for gpu in snapshot.gpus:
        assert isinstance(gpu, GpuSample)
        _assert_fields_match_annotations(gpu)
    for process in snapshot.processes:
        assert isinstance(process, ProcessUsage)
        _assert_fields_match_annotations(process)
        assert process.gpu_index in {gpu.index for gpu in snapshot.gpus}
    split = {gpu.index for gpu in snapshot.gpus if gpu.mig_enabled}
    for device in snapshot.mig_devices:
        assert isinstance(device, MigDevice)
        _assert_fields_match_annotations(device)
        assert device.gpu_index in split, "MIG devices belong to MIG-enabled GPUs"
        assert device.uuid and device.uuid.startswith("MIG-")
    placed = {p.mig_uuid for p in snapshot.processes} - {None}
    assert placed <= {device.uuid for device in snapshot.mig_devices}


def test_gpus_are_in_index_order_and_healthy_ones_report_memory(backend: Backend) -> None:
    snapshot = backend.sample()
    assert [gpu.index for gpu in snapshot.gpus] == list(range(len(snapshot.gpus)))
    for gpu in snapshot.gpus:
        if gpu.ok and gpu.memory_total_bytes is not None:
            assert gpu.memory_used_bytes is not None and gpu.memory_free_bytes is not None
            assert 0 <= gpu.memory_free_bytes <= gpu.memory_total_bytes


def test_faulty_gpu_is_reported_beside_healthy_ones(backend: Backend) -> None:
    snapshot = backend.sample()
    healthy = [gpu for gpu in snapshot.gpus if gpu.ok]
    assert healthy, "a fault in one GPU never hides the others"
    for gpu in snapshot.gpus:
        if not gpu.ok:
            assert gpu.error and gpu.utilization_pct is None


def test_selection_scope_reads_identity_memory_utilization_and_processes(
    backend: Backend,
) -> None:
    # WHEN sampled for a selection THEN uuid, memory, load and the driver's process lists are
    # there, the host's details of each process are not
    snapshot = backend.sample(SampleScope.SELECTION)
    full = backend.sample(SampleScope.FULL)
    assert {(p.pid, p.gpu_index) for p in snapshot.processes} == {
        (p.pid, p.gpu_index) for p in full.processes
    }
    if backend.name == "daemon":
        # The documented difference: the daemon has already read everything, and a client
        # gets its snapshot in full whatever the scope (it costs the driver nothing more).
        assert [(p.pid, p.user, p.command) for p in snapshot.processes] == [
            (p.pid, p.user, p.command) for p in full.processes
        ]
    else:
        assert all(p.user is None and p.command is None for p in snapshot.processes)
    # AND each GPU's name and minor number, by which a scheduler's jobs hold GPUs: a choice
    # without them would give out a GPU a Slurm job holds
    named = [(gpu.index, gpu.name, gpu.minor_number) for gpu in snapshot.gpus if gpu.ok]
    assert named == [(gpu.index, gpu.name, gpu.minor_number) for gpu in full.gpus if gpu.ok]
    for gpu in snapshot.gpus:
        _assert_fields_match_annotations(gpu)
        if gpu.ok:
            assert gpu.uuid and gpu.memory_free_bytes is not None
            # The driver reports no utilization for a MIG-enabled GPU, which is never chosen whole.
            assert gpu.utilization_pct is not None or gpu.mig_enabled
    assert all(device.memory_free_bytes is not None for device in snapshot.mig_devices)


def test_snapshot_survives_a_round_trip_through_json_types(backend: Backend) -> None:
    snapshot = backend.sample()
    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot


def test_close_twice_is_harmless(backend: Backend) -> None:
    backend.close()
    backend.close()


def test_recent_utilization_is_by_uuid_and_a_percentage(backend: Backend) -> None:
    # GIVEN an open backend that has been sampled
    uuids = {gpu.uuid for gpu in backend.sample().gpus}
    # WHEN asked for the last minute's peak utilization
    peaks = backend.recent_utilization_pct(60)
    # THEN it names only GPUs the snapshot has, in percent; only the daemon keeps a history
    assert set(peaks) <= uuids
    assert all(0 <= peak <= 100 for peak in peaks.values())
    assert bool(peaks) is (backend.name == "daemon")
