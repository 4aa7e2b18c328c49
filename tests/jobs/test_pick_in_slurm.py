"""`gpuwatch pick` run by a real Slurm (Debian's slurm-wlm 22.05) in a job step: it takes the
GPU Slurm gave the step, named by gres.conf's device file, and hands it over by UUID.

The cluster's gres.conf lists /dev/nvidia7, 5, 6, 4 (GRES index 0 is nvidia7) and the node's
GPUs (a --sim scenario, or fakenvml behind the real NVML backend) have NVML indices 0-3 on
/dev/nvidia4-7, so a GRES index taken for an NVML or CUDA index names the wrong GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.slurm import SlurmCluster
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd


def uuid_of_minor(minor: int) -> str:
    """The UUID the node's scenario gives the GPU of /dev/nvidia<minor>."""
    return f"GPU-5e1a0000-0000-4000-8000-00000000000{minor}"


def srun_pick(
    cluster: SlurmCluster, env: dict[str, str], tmp_path: Path, *command: str
) -> subprocess.Popen[str]:
    """`srun --gres=gpu:1 gpuwatch pick -- COMMAND`, started (not waited for)."""
    environ = {**cluster.env, **env, "GPUWATCH_LEASE_DIR": str(tmp_path / "leases")}
    environ.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen(
        ["srun", "--gres=gpu:1", sys.executable, "-m", "gpuwatch", "pick", "--", *command],
        env=environ,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_pick_in_a_step_hands_over_the_steps_gpu_by_uuid(
    slurm: SlurmCluster, backend: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a step Slurm gives one GPU
    # WHEN pick runs in it and the command prints what it was given
    step = srun_pick(
        slurm,
        backend,
        tmp_path,
        "sh",
        "-c",
        'echo "$SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES"',
    )
    out, err = step.communicate(timeout=60)
    # THEN the command has the UUID of the GPU whose device file gres.conf lists at the
    # step's GRES index
    assert step.returncode == 0, err
    gres_index, visible = out.split()
    minor = slurm.gpu_minors[int(gres_index)]
    assert visible == uuid_of_minor(minor)
    # AND where Slurm's CUDA_VISIBLE_DEVICES (the GRES index, without a device cgroup) is
    # another GPU's NVML index (NVML index i is /dev/nvidia<4 + i>), one line says so
    noted = [line for line in err.splitlines() if "would name" in line]
    assert len(noted) == (minor != 4 + int(gres_index)), err
    assert "Traceback" not in err


def test_two_jobs_picking_at_once_get_their_own_gpus(
    slurm: SlurmCluster, backend: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN two steps of one GPU each, both running until told to end
    go = tmp_path / "go"
    notes = [tmp_path / "first", tmp_path / "second"]
    steps = [
        srun_pick(
            slurm,
            backend,
            tmp_path,
            "sh",
            "-c",
            f'echo "$SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES" > {note}; '
            f"while [ ! -e {go} ]; do sleep 0.1; done",
        )
        for note in notes
    ]
    try:
        # WHEN pick has run in both
        wait_until(
            lambda: all(note.exists() and note.read_text() for note in notes),
            "both commands to note their GPUs",
            timeout_s=60,
        )
    finally:
        go.touch()
        results = [step.communicate(timeout=60) for step in steps]
    # THEN each has the GPU Slurm gave it, by UUID, and they are different GPUs
    assert [step.returncode for step in steps] == [0, 0], results
    given = [note.read_text().split() for note in notes]
    for gres_index, visible in given:
        assert visible == uuid_of_minor(slurm.gpu_minors[int(gres_index)])
    assert given[0][1] != given[1][1]
