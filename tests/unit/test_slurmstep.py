"""`gpuwatch.placement.slurmstep`: which GPUs a Slurm step was given, from its environment and
gres.conf, and what CUDA_VISIBLE_DEVICES adds to that."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.errors import NoGpuError, VisibleDevicesError
from gpuwatch.models import GpuSample
from gpuwatch.placement.slurmstep import allowed_in_step, slurm_step


def gpus(*minors: int) -> list[GpuSample]:
    """GPUs with NVML indices 0, 1, ... and these minor numbers."""
    return [
        GpuSample(
            index, f"GPU-{minor}", "NVIDIA H100", f"0000:{index:02x}:00.0", minor_number=minor
        )
        for index, minor in enumerate(minors)
    ]


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """A step on node `b1` given GRES index 1, on a cluster whose gres.conf gives node `a1`
    other files than `b[1-2]`."""
    (tmp_path / "gres.conf").write_text(
        "# two kinds of node\n"
        "NodeName=a1 Name=gpu File=/dev/nvidia[0-1]\n"
        "NodeName=b[1-2] Name=gpu Type=h100 File=/dev/nvidia[6-7]\n"
        "Name=mps Count=100\n"
    )
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_GPUS": "1",
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
        "SLURMD_NODENAME": "b1",
    }


def test_the_steps_gpu_is_read_from_its_nodes_lines_of_gres_conf(environ: dict[str, str]) -> None:
    step = slurm_step(environ)
    assert step is not None
    assert (step.files, step.minors, step.said) == (("/dev/nvidia7",), (7,), "SLURM_STEP_GPUS=1")


@pytest.mark.parametrize(
    "change",
    [
        {"GPUWATCH_IGNORE_SLURM": "1"},
        {"GPUWATCH_IGNORE_SLURM": "yes"},
        {"SLURM_JOB_ID": ""},
        {"SLURM_STEP_GPUS": " "},
    ],
    ids=["opted-out", "opted-out-any-word", "no-job", "no-gpus"],
)
def test_outside_a_step_with_gpus_there_is_no_step(
    environ: dict[str, str], change: dict[str, str]
) -> None:
    assert slurm_step({**environ, **change}) is None


def test_a_batch_script_has_the_jobs_gpus(environ: dict[str, str]) -> None:
    step = slurm_step({**environ, "SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": "0"})
    assert step is not None and step.said == "SLURM_JOB_GPUS=0"


def test_opting_out_with_zero_keeps_the_step(environ: dict[str, str]) -> None:
    assert slurm_step({**environ, "GPUWATCH_IGNORE_SLURM": "0"}) is not None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_STEP_GPUS": "1,1"}, "is not a list of GRES indices"),
        ({"SLURM_STEP_GPUS": "0-99999"}, "is not a list of GRES indices"),
        ({"SLURMD_NODENAME": "c1"}, "lists no GPU File= for node c1"),
    ],
    ids=["twice", "hostile-range", "node-gres-conf-forgets"],
)
def test_gpus_that_cannot_be_told_are_refused(
    environ: dict[str, str], change: dict[str, str], message: str
) -> None:
    with pytest.raises(VisibleDevicesError, match=message):
        slurm_step({**environ, **change})


def test_under_a_device_cgroup_slurms_relative_index_agrees(environ: dict[str, str]) -> None:
    # GIVEN a step whose cgroup shows NVML only its GPU (/dev/nvidia7, now NVML 0)
    step = slurm_step(environ)
    assert step is not None
    # WHEN Slurm's CUDA_VISIBLE_DEVICES=0 is weighed THEN it is the step's GPU, nothing said
    assert allowed_in_step(step, gpus(7), ["0"], device_order=None) == (frozenset({0}), None)


def test_a_uuid_naming_none_of_the_steps_gpus_means_no_gpu(environ: dict[str, str]) -> None:
    step = slurm_step(environ)
    assert step is not None
    with pytest.raises(NoGpuError, match="names none of this step's GPUs"):
        allowed_in_step(step, gpus(6, 7), ["GPU-6"], device_order=None)
