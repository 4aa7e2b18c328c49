"""Each GPU's device-file minor number, how Slurm names GPUs: from NVML and from scenarios."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.backends.nvml import NvmlBackend
from gpuwatch.backends.scenario import ScenarioError, scenario_from_dict
from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import Snapshot
from tests.helpers.fake_nvml import FakeGpu, FakeNvml

SECOND_BUS = "00000000:2A:00.0"


def test_nvml_reports_each_gpus_minor_number(fake_nvml: Callable[..., FakeNvml]) -> None:
    # GIVEN a driver whose GPU 0 is /dev/nvidia3 and GPU 1 /dev/nvidia1
    fake_nvml(
        FakeGpu(uuid="GPU-a", minor_number=3),
        FakeGpu(uuid="GPU-b", pci_bus_id=SECOND_BUS, minor_number=1),
    )
    # WHEN the GPUs are read twice
    with NvmlBackend() as backend:
        backend.sample()
        snapshot = backend.sample()
    # THEN each GPU carries its own minor number, not its index
    assert [gpu.minor_number for gpu in snapshot.gpus] == [3, 1]
    # AND it crosses the daemon's wire
    assert Snapshot.from_dict(snapshot.to_dict()).gpus[0].minor_number == 3


def test_a_driver_without_minor_numbers_is_asked_once(fake_nvml: Callable[..., FakeNvml]) -> None:
    # GIVEN a driver that does not report minor numbers
    fake = fake_nvml(FakeGpu(uuid="GPU-a"))
    # WHEN the GPUs are read three times
    with NvmlBackend() as backend:
        snapshots = [backend.sample() for _ in range(3)]
    # THEN the minor number is unknown, asked once, and the GPU is otherwise read as ever
    assert [s.gpus[0].minor_number for s in snapshots] == [None, None, None]
    assert snapshots[-1].gpus[0].error is None
    assert fake.calls["nvmlDeviceGetMinorNumber"] == 1


def scenario(*gpus: dict[str, Any]) -> dict[str, Any]:
    return {"gpu": list(gpus)}


def test_a_scenario_sets_minor_numbers_and_defaults_to_the_index(tmp_path: Path) -> None:
    # GIVEN a scenario whose first GPU is /dev/nvidia5 and second says nothing
    path = tmp_path / "node.toml"
    path.write_text("[[gpu]]\nminor = 5\n\n[[gpu]]\n")
    # WHEN it is sampled
    snapshot = SimBackend(path).sample()
    # THEN the first has 5, the second its index
    assert [gpu.minor_number for gpu in snapshot.gpus] == [5, 1]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(scenario({"minor": 1}, {}), "same minor number", id="clash-with-default"),
        pytest.param(scenario({"minor": 300}), "minor", id="too-big"),
        pytest.param(scenario({"minor": "4"}), "minor", id="a-string"),
        pytest.param(scenario({"count": 2, "minor": 4}), "minor", id="with-count"),
    ],
)
def test_a_bad_minor_number_is_refused_naming_it(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict(data)
