"""gres.conf, hostlists and GRES indices: how Slurm's GPU numbers become device minor numbers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatch.jobs.gres import gpu_indices, minor_number_of, parse_index_list, step_gpu_minors


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        pytest.param("gpu:2(IDX:0-1)", [0, 1], id="plain"),
        pytest.param("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:4),mps:10", [0, 2, 4], id="typed"),
        pytest.param("gpu:0(IDX:)", [], id="none"),
        pytest.param("mps:100(0/100,0/100)", [], id="other-gres"),
        pytest.param("", [], id="empty"),
        pytest.param("gpu(IDX:0-1)", [0, 1], id="before-19.05-gres-idx"),
        pytest.param("gpu:2(IDX:1-0)", None, id="backwards"),
        pytest.param("gpu:2(IDX:x)", None, id="garbled"),
    ],
)
def test_gres_details_give_gpu_indices(gres: str, indices: list[int] | None) -> None:
    assert gpu_indices(gres) == indices


def test_an_index_list_has_a_ceiling() -> None:
    # GIVEN a hostile index range WHEN parsed THEN it is refused, not expanded
    assert parse_index_list("0-4000000000") is None


@pytest.mark.parametrize(
    ("environ", "minors"),
    [
        pytest.param({"SLURM_JOB_GPUS": "0,1"}, (5, 7), id="job"),
        pytest.param({"SLURM_JOB_GPUS": "0,1", "SLURM_STEP_GPUS": "2"}, (6,), id="step-first"),
        pytest.param({"SLURM_STEP_GPUS": "1-3"}, (4, 5, 6), id="range"),
        pytest.param({}, None, id="outside-slurm"),
        pytest.param({"SLURM_JOB_GPUS": "9"}, None, id="index-not-in-gres-conf"),
        pytest.param({"SLURM_JOB_GPUS": "GPU-1234"}, None, id="garbled"),
    ],
)
def test_a_steps_gpus_by_minor_number(
    environ: dict[str, str], minors: tuple[int, ...] | None
) -> None:
    # GIVEN gres.conf naming /dev/nvidia7, 5, 6, 4 in that order
    # WHEN a step's SLURM_*_GPUS are read THEN the GRES indices become those minor numbers
    assert step_gpu_minors(environ, [7, 5, 6, 4]) == minors


def test_a_device_files_minor_number_is_its_own_not_its_names(tmp_path: Path) -> None:
    # GIVEN a device file named nvidia0 whose minor number is 6
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    path = tmp_path / "nvidia0"
    os.mknod(path, 0o600 | 0o020000, os.makedev(195, 6))
    # WHEN its minor number is asked THEN the device's is given; a missing file goes by name
    assert minor_number_of(str(path)) == 6
    assert minor_number_of(str(tmp_path / "nvidia3")) == 3
    assert minor_number_of(str(tmp_path / "gpu")) is None
    # AND a MIG capability device (another major number) is no GPU
    caps = tmp_path / "nvidia-cap21"
    os.mknod(caps, 0o600 | 0o020000, os.makedev(236, 21))
    assert minor_number_of(str(caps)) is None
