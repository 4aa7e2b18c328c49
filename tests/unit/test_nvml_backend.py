"""The NVML backend against a fake driver: versions, faults, unsupported fields, call counts."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable

import pynvml
import pytest

from gpuwatch.backends.base import SampleScope
from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.errors import BackendError, DriverNotFoundError, NoGpuError
from gpuwatch.models import ProcessKind
from tests.helpers.fake_nvml import MIB, FakeGpu, FakeNvml, eight_gpu_node

Install = Callable[..., FakeNvml]


def test_free_memory_is_the_drivers_own_and_reserved_is_reported_apart(fake_nvml: Install) -> None:
    # GIVEN a driver with the v2 memory call
    fake_nvml(FakeGpu(total=1000 * MIB, used=300 * MIB, reserved=50 * MIB))
    # WHEN sampled
    with NvmlBackend() as backend:
        gpu = backend.sample().gpus[0]
    # THEN free is NVML's free (total - used - reserved), not total - used
    assert gpu.memory_free_bytes == 650 * MIB
    assert gpu.memory_used_bytes == 300 * MIB
    assert gpu.memory_reserved_bytes == 50 * MIB


@pytest.mark.parametrize("memory_v2", [True, False], ids=["v2", "v1"])
def test_memory_figures_above_the_total_are_unknown(fake_nvml: Install, memory_v2: bool) -> None:
    # GIVEN a driver saying 100 GiB of 80 are used, and 2**64 - 20 GiB free
    fake_nvml(
        FakeGpu(total=80 << 30, used=100 << 30, free=2**64 - (20 << 30)),
        FakeGpu(uuid="GPU-1"),
        memory_v2=memory_v2,
    )
    # WHEN sampled, for status or for a choice
    with NvmlBackend() as backend:
        for scope in SampleScope:
            broken, fine = backend.sample(scope).gpus
            # THEN used and free are unknown, the total stands, and the other GPU reads
            assert (broken.memory_used_bytes, broken.memory_free_bytes) == (None, None)
            assert broken.memory_total_bytes == 80 << 30
            assert fine.memory_free_bytes is not None


def test_driver_without_memory_v2_falls_back_to_v1(fake_nvml: Install) -> None:
    # GIVEN an older driver without nvmlDeviceGetMemoryInfo_v2
    fake = fake_nvml(FakeGpu(total=1000 * MIB, used=300 * MIB, reserved=50 * MIB), memory_v2=False)
    with NvmlBackend() as backend:
        first = backend.sample().gpus[0]
        calls_after_first = fake.calls["nvmlDeviceGetMemoryInfo"]
        second = backend.sample().gpus[0]
    # THEN free is still the driver's; reserved cannot be told apart, so it is None
    assert first.memory_free_bytes == second.memory_free_bytes == 650 * MIB
    assert first.memory_used_bytes == 350 * MIB
    assert first.memory_reserved_bytes is None
    # AND the v2 call is not tried again once it failed
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - calls_after_first == 1


@pytest.mark.parametrize(
    ("versions", "expected_symbol"),
    [
        (("v3", "v2", "v1"), "nvmlDeviceGetComputeRunningProcesses_v3"),
        (("v2", "v1"), "nvmlDeviceGetComputeRunningProcesses_v2"),
        (("v1",), "nvmlDeviceGetComputeRunningProcesses"),
    ],
    ids=["v3-driver", "v2-driver", "v1-driver"],
)
def test_process_lists_use_the_newest_layout_the_driver_offers(
    fake_nvml: Install, versions: tuple[str, ...], expected_symbol: str
) -> None:
    fake = fake_nvml(FakeGpu(compute=[(101, 10 * MIB), (102, 20 * MIB)]), process_versions=versions)
    with NvmlBackend() as backend:
        backend.sample()
        fake.calls.clear()
        processes = backend.sample().processes
    assert [(p.pid, p.memory_used_bytes) for p in processes] == [(101, 10 * MIB), (102, 20 * MIB)]
    assert fake.calls[expected_symbol] == 1, "one call per list once the version is known"


def test_process_in_both_lists_is_one_compute_graphics_process(fake_nvml: Install) -> None:
    fake_nvml(FakeGpu(compute=[(7, 5 * MIB), (8, 1 * MIB)], graphics=[(7, 5 * MIB), (9, 2 * MIB)]))
    with NvmlBackend() as backend:
        kinds = {p.pid: p.kind for p in backend.sample().processes}
    assert kinds == {
        7: ProcessKind.COMPUTE_GRAPHICS,
        8: ProcessKind.COMPUTE,
        9: ProcessKind.GRAPHICS,
    }


def test_mps_clients_are_listed_as_mps_processes(fake_nvml: Install) -> None:
    # GIVEN a GPU shared through MPS: its server is a compute process, its clients are
    # in the driver's MPS list only
    fake_nvml(FakeGpu(compute=[(10, 300 * MIB)], mps=[(11, 2000 * MIB), (12, 1000 * MIB)]))
    # WHEN sampled
    with NvmlBackend() as backend:
        processes = backend.sample().processes
    # THEN the clients are listed too, with their memory, as MPS processes
    assert [(p.pid, p.memory_used_bytes, p.kind) for p in processes] == [
        (10, 300 * MIB, ProcessKind.COMPUTE),
        (11, 2000 * MIB, ProcessKind.MPS),
        (12, 1000 * MIB, ProcessKind.MPS),
    ]


def test_a_gpu_without_mps_is_not_asked_for_mps_clients_again(fake_nvml: Install) -> None:
    # GIVEN one GPU whose driver does not support the MPS list, and one that does
    fake = fake_nvml(
        FakeGpu(compute=[(10, MIB)], unsupported={"mps processes"}),
        FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", mps=[(20, MIB)]),
    )
    with NvmlBackend() as backend:
        first = backend.sample()
        fake.calls.clear()
        second = backend.sample()
    # THEN both samples list what each GPU has, with no fault reported
    for snapshot in (first, second):
        assert [(p.gpu_index, p.pid) for p in snapshot.processes] == [(0, 10), (1, 20)]
        assert [gpu.error for gpu in snapshot.gpus] == [None, None]
    # AND after the first answer only the GPU that has the list is asked for it
    assert fake.calls["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 1


def test_more_processes_than_the_buffer_holds_are_all_read(fake_nvml: Install) -> None:
    listed = [(1000 + n, MIB) for n in range(150)]
    fake_nvml(FakeGpu(compute=listed))
    with NvmlBackend() as backend:
        assert len(backend.sample().processes) == 150


def test_process_of_another_pid_namespace_has_no_host_details(fake_nvml: Install) -> None:
    # GIVEN a pid the host cannot see (no such process here)
    fake_nvml(FakeGpu(compute=[(2**22 + 12345, MIB)]))
    with NvmlBackend() as backend:
        (process,) = backend.sample().processes
    assert process.memory_used_bytes == MIB
    assert (process.user, process.command, process.cpu_pct, process.rss_bytes) == (None,) * 4


def test_visible_process_gets_user_command_and_cpu(fake_nvml: Install) -> None:
    # GIVEN the driver reports this very test process
    fake_nvml(FakeGpu(compute=[(os.getpid(), MIB)]))
    with NvmlBackend() as backend:
        (process,) = backend.sample().processes
    # THEN the host's view of it is filled in
    assert process.user == pwd.getpwuid(os.getuid()).pw_name
    assert process.command and process.command.split()[0].endswith(("python", "pytest"))
    assert process.rss_bytes and process.rss_bytes > 0
    assert process.cpu_pct is not None and process.started_at is not None


def test_unsupported_fields_are_none_and_not_asked_again(fake_nvml: Install) -> None:
    # GIVEN a passively cooled GPU without power readings
    fake = fake_nvml(FakeGpu(unsupported={"fan", "power"}))
    with NvmlBackend() as backend:
        first = backend.sample().gpus[0]
        backend.sample()
    assert first.fan_pct is None and first.power_w is None
    assert first.ok, "not supported is not an error"
    assert first.temperature_c == 60 and first.power_limit_w == 700.0
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1


def test_lost_gpu_is_reported_and_the_others_still_read(fake_nvml: Install) -> None:
    fake = fake_nvml(
        FakeGpu(uuid="GPU-a"), FakeGpu(uuid="GPU-b", compute=[(5, MIB)]), FakeGpu(uuid="GPU-c")
    )
    with NvmlBackend() as backend:
        backend.sample()
        # WHEN GPU 1 falls off the bus
        fake.gpus[1].lost = True
        snapshot = backend.sample()
        # THEN it carries the error and its identity, and GPUs 0 and 2 are read as before
        lost = snapshot.gpus[1]
        assert lost.error == "GPU is lost" and lost.uuid == "GPU-b"
        assert lost.memory_free_bytes is None
        assert [gpu.ok for gpu in snapshot.gpus] == [True, False, True]
        assert snapshot.processes == ()
        # AND WHEN it comes back THEN it is read again
        fake.gpus[1].lost = False
        assert backend.sample().gpus[1].ok


def test_gpu_lost_before_start_is_reported_without_identity(fake_nvml: Install) -> None:
    fake_nvml(FakeGpu(lost=True), FakeGpu(uuid="GPU-ok"))
    with NvmlBackend() as backend:
        lost, healthy = backend.sample().gpus
    assert lost.error == "GPU is lost" and lost.uuid is None
    assert healthy.ok and healthy.uuid == "GPU-ok"


def test_a_gpu_that_cannot_tell_its_uuid_is_still_named_by_its_pci_bus_id(
    fake_nvml: Install,
) -> None:
    # GIVEN a GPU whose UUID and readings fail, but whose PCI bus id the driver still knows
    fake_nvml(FakeGpu(failing={"uuid", "memory", "utilization"}, pci_bus_id="00000000:3B:00.0"))
    with NvmlBackend() as backend:
        (gpu,) = backend.sample().gpus
    # THEN it is reported faulty, under what the driver could tell
    assert not gpu.ok and gpu.uuid is None and gpu.pci_bus_id == "00000000:3B:00.0"


def test_one_failing_field_is_named_in_the_error_and_the_rest_is_read(fake_nvml: Install) -> None:
    fake_nvml(FakeGpu(failing={"temperature"}))
    with NvmlBackend() as backend:
        gpu = backend.sample().gpus[0]
    assert gpu.error == "temperature: Unknown Error"
    assert gpu.temperature_c is None and gpu.memory_free_bytes is not None


@pytest.mark.parametrize(
    ("error", "expected", "message"),
    [
        (pynvml.NVMLError_LibraryNotFound, DriverNotFoundError, "NVIDIA driver not found"),
        (pynvml.NVMLError_DriverNotLoaded, DriverNotFoundError, "NVIDIA driver not loaded"),
        (pynvml.NVMLError_NoPermission, DriverNotFoundError, "no permission"),
        (pynvml.NVMLError_Unknown, BackendError, "NVML failed to start"),
    ],
    ids=["no-library", "driver-not-loaded", "no-permission", "unknown"],
)
def test_driver_missing_is_one_clear_error(
    fake_nvml: Install, error: type[pynvml.NVMLError], expected: type[Exception], message: str
) -> None:
    fake_nvml(init_error=error)
    with pytest.raises(expected, match=message) as raised:
        NvmlBackend()
    assert "\n" not in str(raised.value)


def test_driver_with_no_gpu_is_no_gpu_error(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml([]).install(monkeypatch)
    with pytest.raises(NoGpuError):
        NvmlBackend()


def test_driver_and_cuda_versions_are_read_once(fake_nvml: Install) -> None:
    fake = fake_nvml(cuda_version=12040)
    with NvmlBackend() as backend:
        first = backend.sample()
        backend.sample()
    assert (first.driver_version, first.cuda_driver_version) == ("580.95.05", "12.4")
    assert fake.calls["nvmlSystemGetDriverVersion"] == 1


class TestCallBudget:
    """Driver calls are what watching costs: the budgets the README promises."""

    def test_one_shot_status_on_8_gpus_and_40_processes_costs_17_calls_per_gpu_plus_5(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # 5 identity calls (the minor number too, for Slurm's gres.conf), 8 metrics (the
        # fan's "not supported" included), 3 process lists
        # and the processes' utilization per GPU; start, count, two versions and shutdown for
        # the machine. gpustat makes 124, without looking for MPS clients or SM use.
        fake = eight_gpu_node().install(monkeypatch)
        with NvmlBackend() as backend:
            snapshot = backend.sample()
        assert len(snapshot.processes) == 40
        assert fake.total_calls <= 17 * 8 + 5, fake.calls

    def test_each_further_sample_costs_at_most_10_calls_per_gpu(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fake = eight_gpu_node().install(monkeypatch)
        with NvmlBackend() as backend:
            backend.sample()
            fake.calls.clear()
            backend.sample()
            assert fake.total_calls <= 10 * 8, fake.calls
            # AND identity is not read again
            assert fake.calls["nvmlDeviceGetName"] == fake.calls["nvmlDeviceGetUUID"] == 0

    def test_a_selection_costs_at_most_9_calls_per_gpu_plus_3(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # (handle, UUID, name and minor number - which tell a scheduler's jobs -, memory,
        # utilization, and the compute, graphics and MPS process lists)
        fake = eight_gpu_node().install(monkeypatch)
        with NvmlBackend() as backend:
            backend.sample(SampleScope.SELECTION)
        assert fake.total_calls <= 9 * 8 + 3, fake.calls
