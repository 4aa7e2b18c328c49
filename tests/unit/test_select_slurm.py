"""`gpuwatch.select()` inside a Slurm step: the step's GPUs, by UUID, whatever Slurm's
CUDA_VISIBLE_DEVICES says (the node of tests/jobs/data/slurm-node.toml: GRES index 0 is
/dev/nvidia7, NVML index 3)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuwatch
from gpuwatch.errors import VisibleDevicesError
from gpuwatch.placement import selection as selection_module

NODE = str(Path(__file__).parents[1] / "jobs" / "data" / "slurm-node.toml")
STEP_GPU = "GPU-5e1a0000-0000-4000-8000-000000000007"
OTHER_JOBS_GPU = "GPU-5e1a0000-0000-4000-8000-000000000004"


@pytest.fixture(autouse=True)
def in_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Slurm step given GRES index 0 of a gres.conf listing nvidia7, 5, 6, 4; nothing
    selected before or after."""
    files = ",".join(f"{tmp_path}/dev/nvidia{minor}" for minor in (7, 5, 6, 4))
    (tmp_path / "gres.conf").write_text(f"Name=gpu File={files}\n")
    for name, value in {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_GPUS": "0",
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
        "CUDA_VISIBLE_DEVICES": "0",  # Slurm's, without a device cgroup: NVML GPU 0
    }.items():
        monkeypatch.setenv(name, value)
    yield
    if selection_module._this_process.selection is not None:
        selection_module._this_process.selection.release()
    os.environ.pop("CUDA_DEVICE_ORDER", None)


def test_select_takes_the_steps_gpu_and_says_slurms_index_names_another() -> None:
    # GIVEN a step whose Slurm CUDA_VISIBLE_DEVICES=0 names another job's GPU
    # WHEN the script selects a GPU
    with pytest.warns(RuntimeWarning, match=f"would name GPU 0 \\({OTHER_JOBS_GPU}\\)"):
        selection = gpuwatch.select(sim=NODE)
    # THEN it has the step's GPU, and CUDA will see it by UUID
    assert selection.uuids == [STEP_GPU]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == STEP_GPU


def test_select_in_a_step_gres_conf_does_not_cover_raises_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a step given a GRES index beyond gres.conf's list
    monkeypatch.setenv("SLURM_STEP_GPUS", "9")
    # WHEN the script selects a GPU THEN it is told what is wrong and how to opt out
    with pytest.raises(VisibleDevicesError, match=r"GRES index 9 names no GPU.*IGNORE_SLURM=1"):
        gpuwatch.select(sim=NODE)
