"""Issue 28's repro against a real Slurm: gres.conf with a continued line, whose files
slurmd lists first. A job given GRES index 0 holds /dev/nvidia7 (the continued line's first
file), and gpuwatch says so: the reader, and `pick` inside the job's step."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.slurm import SlurmCluster, gpu_job, job_env, slurm_reader, start_cluster, why_not

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd

DATA = Path(__file__).parent / "data"
CONTINUED = """\
NodeName={node} Name=gpu \\
  File={dev}/nvidia7,{dev}/nvidia5
NodeName={node} Name=gpu File={dev}/nvidia6,{dev}/nvidia4
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = why_not()
    if reason is not None:
        if os.environ.get("GPUWATCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUWATCH_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    started = start_cluster(
        tmp_path_factory.mktemp("slurm"), (7, 5, 6, 4), oversubscribe=10, gres_conf=CONTINUED
    )
    yield started
    started.close()


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield cluster
    cluster.cancel_all()


def test_a_continued_lines_first_file_is_gres_index_0(slurm: SlurmCluster) -> None:
    # GIVEN the first job of one GPU on the node: Slurm gives it GRES index 0
    job_id = gpu_job(slurm, 1)
    assert job_env(slurm, job_id)["SLURM_JOB_GPUS"] == "0"
    # WHEN gpuwatch reads the node's jobs
    table = slurm_reader(slurm).table()
    # THEN the job holds /dev/nvidia7: the continued line's first file
    assert table is not None
    assert {minor: job.job_id for minor, job in table.by_minor_number.items()} == {7: job_id}


def test_pick_in_the_step_takes_the_gpu_slurmd_gave_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    # GIVEN a step of one GPU (GRES index 0: nvidia7), on a node whose NVML GPUs 0-3 are
    # /dev/nvidia4-7 (a --sim scenario)
    env = {
        **slurm.env,
        "GPUWATCH_BACKEND": "sim",
        "GPUWATCH_SIM": str(DATA / "slurm-node.toml"),
        "GPUWATCH_LEASE_DIR": str(tmp_path / "leases"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # WHEN pick runs in it and the command prints what it was given
    command = 'echo "$SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES"'
    pick = [sys.executable, "-m", "gpuwatch", "pick", "--", "sh", "-c", command]
    step = subprocess.run(
        ["srun", "--gres=gpu:1", *pick],
        env=env, cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    # THEN the command has nvidia7's UUID, not nvidia6's (the next line's first file)
    assert step.returncode == 0, step.stderr
    assert step.stdout.split() == ["0", "GPU-5e1a0000-0000-4000-8000-000000000007"]
