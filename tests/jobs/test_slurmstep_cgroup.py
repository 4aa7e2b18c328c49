"""Inside a Slurm step, what the step can open wins: where its device cgroup and gres.conf
(with SLURM_STEP_GPUS) disagree, pick chooses among the GPUs the step can open, and says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatch.errors import NoGpuError, VisibleDevicesError
from gpuwatch.models import GpuSample
from gpuwatch.placement.slurmstep import allowed_in_step, device_opens, slurm_step, step_gpus


def gpus(*minors: int) -> list[GpuSample]:
    """GPUs with NVML indices 0, 1, ... and these minor numbers."""
    return [
        GpuSample(
            index, f"GPU-{minor}", "NVIDIA H100", f"0000:{index:02x}:00.0", minor_number=minor
        )
        for index, minor in enumerate(minors)
    ]


def step_env(tmp_path: Path, gres_conf: str) -> dict[str, str]:
    (tmp_path / "gres.conf").write_text(gres_conf)
    return {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_GPUS": "0",
        "SLURM_CONF": str(tmp_path / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
    }


NODE = gpus(4, 5, 6, 7)


def test_without_a_device_cgroup_gres_conf_decides(tmp_path: Path) -> None:
    step = slurm_step(step_env(tmp_path, "Name=gpu File=/dev/nvidia[7,5,6,4]\n"))
    assert step is not None
    assert step_gpus(step, NODE, lambda: None) == (frozenset({3}), None)


def test_where_the_cgroup_and_gres_conf_agree_nothing_is_said(tmp_path: Path) -> None:
    step = slurm_step(step_env(tmp_path, "Name=gpu File=/dev/nvidia[7,5,6,4]\n"))
    assert step is not None
    assert step_gpus(step, NODE, lambda: frozenset({7})) == (frozenset({3}), None)


def test_where_they_disagree_what_the_step_can_open_wins_and_is_said(tmp_path: Path) -> None:
    # GIVEN gres.conf saying GRES index 0 is nvidia7, and a device cgroup that lets the
    # step open nvidia6 only (gres.conf edited after slurmd read it)
    step = slurm_step(step_env(tmp_path, "Name=gpu File=/dev/nvidia[7,5,6,4]\n"))
    assert step is not None
    # WHEN the step's GPUs are chosen from
    allowed, note = allowed_in_step(
        step, NODE, None, device_order=None, openable=lambda: frozenset({6})
    )
    # THEN the GPU it can open is chosen from, and one line says why
    assert allowed == frozenset({2})
    assert note is not None and "can open only GPU 2 (GPU-6)" in note and "GPU 3" in note


def test_a_gres_conf_that_cannot_be_read_is_passed_over_under_a_cgroup(tmp_path: Path) -> None:
    # GIVEN AutoDetect=nvml alone (the order cannot be told), under a device cgroup
    environ = step_env(tmp_path, "AutoDetect=nvml\n")
    opens = frozenset({5})
    step = slurm_step(environ, openable=lambda: opens)
    assert step is not None
    # THEN what the step can open tells its GPU, and the note says gres.conf could not
    allowed, note = step_gpus(step, NODE, lambda: opens)
    assert allowed == frozenset({1}) and note is not None and "AutoDetect=nvml" in note
    # AND without a cgroup, that gres.conf is refused as before
    with pytest.raises(VisibleDevicesError, match="AutoDetect=nvml"):
        slurm_step(environ, openable=lambda: None)


def test_a_step_that_can_open_no_gpu_here_has_none(tmp_path: Path) -> None:
    step = slurm_step(step_env(tmp_path, "Name=gpu File=/dev/nvidia[7,5,6,4]\n"))
    assert step is not None
    with pytest.raises(NoGpuError, match="can open none"):
        step_gpus(step, NODE, lambda: frozenset({9}))


def test_device_opens_tells_a_forbidding_cgroup_from_none(tmp_path: Path) -> None:
    # GIVEN GPU device files this process can open (no cgroup forbids them here)
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    for minor in (0, 1):
        os.mknod(tmp_path / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    (tmp_path / "nvidiactl").touch()
    # WHEN they are probed THEN none is forbidden: no limit to tell
    assert device_opens(tmp_path) is None
