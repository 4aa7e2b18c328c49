"""gres.conf, hostlists and GRES indices: how Slurm's GPU numbers become device minor numbers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatch.jobs import step_gpu_minors
from gpuwatch.jobs.gres import (
    expand_hostlist,
    gpu_indices,
    gres_gpu_files,
    minor_number_of,
    parse_index_list,
)

GRES_CONF = """\
# a site's gres.conf
AutoDetect=off
NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-3]
NodeName=gpu03 Name=gpu File=/dev/nvidia3,/dev/nvidia1   # wired the other way round
NodeName=gpu03 Name=gpu File=/dev/nvidia0
Name=mps Count=400
NodeName=gpu03 name=GPU file=/dev/nvidia2
"""


@pytest.mark.parametrize(
    ("node", "files"),
    [
        pytest.param("gpu02", [f"/dev/nvidia{n}" for n in range(4)], id="range"),
        pytest.param(
            "gpu03",
            ["/dev/nvidia3", "/dev/nvidia1", "/dev/nvidia0", "/dev/nvidia2"],
            id="conf-order-over-lines",
        ),
        pytest.param("cpu01", [], id="other-node"),
    ],
)
def test_gres_conf_lists_a_nodes_gpu_files_in_its_own_order(node: str, files: list[str]) -> None:
    # GIVEN a gres.conf for several nodes WHEN a node's GPU files are read
    # THEN they come in gres.conf's order, which is the GRES index order
    assert gres_gpu_files(GRES_CONF, node) == files


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        pytest.param("vm", ["vm"], id="one"),
        pytest.param(
            "node[01-03,07],gpu14", ["node01", "node02", "node03", "node07", "gpu14"], id="ranges"
        ),
        pytest.param("r[1-2]-n[8-9]", ["r1-n8", "r1-n9", "r2-n8", "r2-n9"], id="two-brackets"),
        pytest.param("n[1-", [], id="unclosed"),
        pytest.param("n[3-1]", [], id="backwards"),
        pytest.param("n[0-99999999]", [], id="too-many"),
        pytest.param("", [], id="empty"),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(expression: str, names: list[str]) -> None:
    assert expand_hostlist(expression) == names


@pytest.mark.parametrize(
    ("gres", "indices"),
    [
        pytest.param("gpu:2(IDX:0-1)", [0, 1], id="plain"),
        pytest.param("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:4),mps:10", [0, 2, 4], id="typed"),
        pytest.param("gpu:0(IDX:)", [], id="none"),
        pytest.param("mps:100(0/100,0/100)", [], id="other-gres"),
        pytest.param("", [], id="empty"),
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
