"""Shared fixtures: a CLI runner that goes through `main()`, a frozen clock, a fake driver."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture(autouse=True)
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own lease directory, and chooses its own backend, daemon and GPUs:
    the developer's shell must not choose them for it."""
    for name in (
        "GPUWATCH_BACKEND",
        "GPUWATCH_SIM",
        "GPUWATCH_NODE_NAME",
        "NO_COLOR",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        # Run inside a Slurm job, pick and select() would choose among its GPUs alone.
        "SLURM_JOB_ID",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
        "GPUWATCH_IGNORE_SLURM",
    ):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "leases"
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(path))
    # Nor may a daemon that happens to run on this machine answer for the driver.
    monkeypatch.setenv("GPUWATCH_SOCKET", str(tmp_path / "no-daemon.sock"))
    return path


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Installs a fake driver with the given GPUs (default: two healthy ones)."""

    def install(*gpus: FakeGpu, **settings: object) -> FakeNvml:
        chosen = list(gpus) or [
            FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000"),
            FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", pci_bus_id="00000000:2A:00.0"),
        ]
        return FakeNvml(chosen, **settings).install(monkeypatch)  # type: ignore[arg-type]

    return install


def _has_gpu() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need a real NVIDIA GPU and driver; elsewhere they are skipped."""
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (nvidia-smi and libnvidia-ml.so.1)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
