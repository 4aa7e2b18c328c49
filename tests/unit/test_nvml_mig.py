"""MIG over the NVML backend, against a fake driver: what is read, what it costs, faults."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuwatch.backends.base import SampleScope
from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.models import MigDevice, Snapshot
from tests.helpers.fake_nvml import MIB, FakeGpu, FakeNvml, eight_gpu_node, mig_gpu

Install = Callable[..., FakeNvml]


def _node(fake_nvml: Install) -> FakeNvml:
    """GPU 0 in MIG mode (3g.40gb busy, 2g.20gb, 1g.10gb); GPU 1 a plain GPU."""
    gpu = mig_gpu(0, ("3g.40gb", "2g.20gb", "1g.10gb"), compute=[(501, 2048 * MIB)])
    gpu.migs[0].used = 2048 * MIB
    gpu.instances[501] = (gpu.migs[0].gpu_instance_id, 0)
    return fake_nvml(gpu, FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000"))


def test_mig_devices_are_read_with_ids_profile_and_memory(fake_nvml: Install) -> None:
    # GIVEN GPU 0 in MIG mode with three MIG devices, GPU 1 without MIG
    _node(fake_nvml)
    # WHEN sampled
    with NvmlBackend() as backend:
        snapshot = backend.sample()
    # THEN each GPU says whether it is MIG-enabled
    assert [gpu.mig_enabled for gpu in snapshot.gpus] == [True, False]
    # AND GPU 0's MIG devices are listed under it, with what NVML reports of them
    assert snapshot.mig_devices_of(1) == ()
    first, *_, last = snapshot.mig_devices_of(0)
    assert [m.label for m in snapshot.mig_devices] == ["0:0", "0:1", "0:2"]
    assert [m.profile for m in snapshot.mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert first == MigDevice(
        gpu_index=0,
        index=0,
        uuid="MIG-00000000-0000-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        profile="3g.40gb",
        gpu_instance_id=1,
        compute_instance_id=0,
        memory_total_bytes=39936 * MIB,
        memory_used_bytes=2048 * MIB,
        memory_free_bytes=37888 * MIB,
    )
    assert last.memory_free_bytes == last.memory_total_bytes == 9984 * MIB
    # AND the GPU's process is placed in its MIG device
    (process,) = snapshot.processes
    assert process.mig_uuid == first.uuid
    assert snapshot.processes_in(first) == (process,)


def test_a_mig_enabled_gpu_reports_no_utilization(fake_nvml: Install) -> None:
    _node(fake_nvml)
    with NvmlBackend() as backend:
        gpu = backend.sample().gpus[0]
    assert gpu.utilization_pct is None
    assert gpu.error is None, "not being able to read utilization under MIG is not a fault"


def test_processes_without_instance_ids_are_not_placed(fake_nvml: Install) -> None:
    # GIVEN an old driver whose process list (v1) carries no MIG instance ids
    gpu = mig_gpu(0, ("1g.10gb",), compute=[(501, 100 * MIB)])
    gpu.instances[501] = (1, 0)
    fake_nvml(gpu, process_versions=("v1",))
    with NvmlBackend() as backend:
        (process,) = backend.sample().processes
    # THEN the process is on its GPU, in an unknown MIG device
    assert (process.gpu_index, process.mig_uuid) == (0, None)


@pytest.mark.parametrize("scope", list(SampleScope), ids=lambda scope: scope.value)
def test_reading_mig_costs_no_call_on_gpus_without_it(scope: SampleScope) -> None:
    # GIVEN the 8-GPU node, no GPU in MIG mode, whose call counts the benchmarks report
    with pytest.MonkeyPatch.context() as patch:
        fake = eight_gpu_node().install(patch)
        # WHEN it is sampled twice
        with NvmlBackend() as backend:
            backend.sample(scope)
            backend.sample(scope)
    # THEN no MIG function was called
    assert not [name for name in fake.calls if "Mig" in name or "Instance" in name]


def test_a_mig_enabled_gpu_costs_a_bounded_number_of_calls_per_sample(fake_nvml: Install) -> None:
    # GIVEN a GPU with three MIG devices, sampled once already
    fake = _node(fake_nvml)
    with NvmlBackend() as backend:
        backend.sample()
        fake.calls.clear()
        # WHEN sampled again
        backend.sample()
    # THEN MIG costs the mode, 4 handle lookups (the 4th finds none), and a UUID and memory each
    mig_calls = {
        name: count
        for name, count in fake.calls.items()
        if "Mig" in name or name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName")
    }
    assert mig_calls == {
        "nvmlDeviceGetMigMode": 1,
        "nvmlDeviceGetMigDeviceHandleByIndex": 4,
        "nvmlDeviceGetUUID": 3,
    }
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2 + 3
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1, "asked of GPU 1 only"


def test_a_gpu_leaving_mig_mode_reports_utilization_again(fake_nvml: Install) -> None:
    # GIVEN a MIG-enabled GPU, sampled
    fake = fake_nvml(mig_gpu(0, ("1g.10gb",), utilization=42))
    with NvmlBackend() as backend:
        backend.sample()
        # WHEN MIG mode is turned off (after a GPU reset) and its devices are gone
        fake.gpus[0].mig_mode = 0
        fake.gpus[0].migs.clear()
        backend.sample()
        gpu = backend.sample().gpus[0]
    # THEN the GPU is a whole GPU again, with its utilization
    assert (gpu.mig_enabled, gpu.utilization_pct) == (False, 42)


def test_a_mig_device_that_vanishes_is_reported_on_its_gpu(fake_nvml: Install) -> None:
    # GIVEN a GPU with three MIG devices, sampled
    fake = _node(fake_nvml)
    with NvmlBackend() as backend:
        backend.sample()
        # WHEN the GPU is reconfigured: its 2g.20gb device is destroyed
        gone = fake.gpus[0].migs[1]
        gone.gone = True
        snapshot = backend.sample()
        later = backend.sample()
    # THEN the device is no longer listed, and the GPU says it vanished
    assert [m.profile for m in snapshot.mig_devices] == ["3g.40gb", "1g.10gb"]
    for sample in (snapshot, later):
        error = sample.gpus[0].error or ""
        assert f"MIG device 0:1 (2g.20gb) {gone.uuid} vanished" in error
    # AND the GPU is still known to be in MIG mode, the other GPU untouched
    assert snapshot.gpus[0].mig_enabled is True
    assert snapshot.gpus[1].error is None


def test_a_lost_gpu_names_its_mig_devices_and_hides_no_other_gpu(fake_nvml: Install) -> None:
    # GIVEN a MIG-enabled GPU, sampled
    fake = _node(fake_nvml)
    with NvmlBackend() as backend:
        backend.sample()
        # WHEN it falls off the bus
        fake.gpus[0].lost = True
        snapshot = backend.sample()
    # THEN the GPU's error says so and names the MIG devices lost with it
    error = snapshot.gpus[0].error or ""
    assert error.startswith("GPU is lost")
    assert "0:0 (3g.40gb)" in error and "0:2 (1g.10gb)" in error
    assert snapshot.mig_devices == () and snapshot.gpus[0].mig_enabled is None
    # AND the other GPU reads as before
    assert snapshot.gpus[1].error is None and snapshot.gpus[1].memory_free_bytes


def test_snapshot_with_mig_devices_round_trips_through_a_dict(fake_nvml: Install) -> None:
    _node(fake_nvml)
    with NvmlBackend() as backend:
        snapshot = backend.sample()
    assert Snapshot.from_dict(snapshot.to_dict()) == snapshot


def test_a_snapshot_dict_without_mig_fields_still_reads() -> None:
    # GIVEN a snapshot from an older daemon, which knows nothing of MIG
    data = {
        "taken_at": 1.0,
        "hostname": "node",
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [{"index": 0, "uuid": "GPU-1", "name": None, "pci_bus_id": None}],
        "processes": [],
    }
    snapshot = Snapshot.from_dict(data)
    assert snapshot.mig_devices == () and snapshot.gpus[0].mig_enabled is None


def test_a_mig_device_that_fails_to_read_is_reported_not_taken_for_vanished(
    fake_nvml: Install,
) -> None:
    # GIVEN a MIG-enabled GPU, sampled
    fake = _node(fake_nvml)
    with NvmlBackend() as backend:
        backend.sample()
        # WHEN reading the MIG devices' memory fails once
        fake.gpus[0].failing.add("memory")
        snapshot = backend.sample()
    # THEN each device carries the error, keeps its UUID, and none is said to have vanished
    assert [m.uuid for m in snapshot.mig_devices] == [m.uuid for m in fake.gpus[0].migs]
    assert all(m.error and m.memory_free_bytes is None for m in snapshot.mig_devices)
    assert "vanished" not in (snapshot.gpus[0].error or "")
