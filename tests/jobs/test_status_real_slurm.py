"""`gpuwatch status` on a node of a real Slurm (Debian's slurm-wlm 22.05, started by
tests/helpers/slurm.py): each job is shown under exactly the GPUs Slurm gave it.

The GPUs are tests/jobs/data/slurm-node.toml: NVML index i has minor number 4 + i, and the
cluster's gres.conf lists minors 7, 5, 6, 4, so no test passes by taking a GRES index for
an NVML index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.slurm import SlurmCluster, gpu_job, job_env
from tests.helpers.slurm_stand_in import NODE
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd


@pytest.fixture
def on_the_node(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """gpuwatch's environment on the cluster's node: its SLURM_CONF and node name."""
    for name in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(name, slurm.env[name])
    monkeypatch.setenv("SLURMD_NODENAME", slurm.node)
    return slurm


def status_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`gpuwatch status --json` as run afresh (its own, empty cache folder)."""
    run = Path(tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}")
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    result = run_cli("status", "--sim", str(NODE), "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def nvml_indices(cluster: SlurmCluster, job_id: str) -> list[int]:
    """The NVML indices of the GPUs Slurm gave the job, from its own SLURM_JOB_GPUS."""
    minors = cluster.minors_of(job_env(cluster, job_id)["SLURM_JOB_GPUS"])
    return sorted(minor - 4 for minor in minors)


def test_status_shows_each_job_under_the_gpus_slurm_gave_it(
    on_the_node: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two jobs of 2 GPUs each, submitted with sbatch --gres=gpu:2
    first, second = gpu_job(on_the_node, 2), gpu_job(on_the_node, 2)
    expected = dict.fromkeys(nvml_indices(on_the_node, first), first)
    expected.update(dict.fromkeys(nvml_indices(on_the_node, second), second))

    # WHEN status is run (again, should the loaded test machine's Slurm miss the deadline)
    def holders() -> dict[int, str]:
        data = status_json(tmp_path, monkeypatch)
        return {gpu["index"]: gpu["job_id"] for gpu in data["gpus"] if gpu["job_id"]}

    held = wait_until(lambda: holders() or None, "status never showed the jobs")
    # THEN each GPU shows the job Slurm gave it, and the JSON lists both jobs on those GPUs
    assert held == expected
    jobs = {job["job_id"]: job for job in status_json(tmp_path, monkeypatch)["jobs"]}
    assert jobs[first]["gpus"] == nvml_indices(on_the_node, first)
    assert jobs[second]["gpus"] == nvml_indices(on_the_node, second)
    assert (jobs[first]["user"], jobs[first]["name"]) == ("root", "train")


def test_the_table_names_the_job_under_its_gpus(
    on_the_node: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a job of 2 GPUs
    job_id = gpu_job(on_the_node, 2)
    given = nvml_indices(on_the_node, job_id)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))

    # WHEN status is shown as a table
    def lines() -> list[str] | None:
        out = run_cli("status", "--sim", str(NODE)).stdout.splitlines()
        return out if any(line.startswith("  job ") for line in out) else None

    shown = wait_until(lines, "status never showed the job")
    # THEN the job's line follows exactly the GPUs it was given
    for index in range(4):
        position = next(n for n, line in enumerate(shown) if line.startswith(f"[{index}] "))
        follower = shown[position + 1] if position + 1 < len(shown) else ""
        assert follower.startswith(f"  job {job_id} root  train") == (index in given), shown
