"""Who holds each GPU, on a node of a real Slurm (Debian's slurm-wlm 22.05), as `pick` and
`select()` learn it without a daemon and through one: a GPU a running job holds is never
given out, and while Slurm does not answer no GPU is (`--allow-unknown-holders` takes them).

The node's GPUs are read from its --sim scenario and, where ../shared/fakenvml can be built,
by the real NVML backend: a choice samples less than `status` does, and must still tell
each GPU's device file, by which Slurm names the GPUs its jobs hold.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import running_daemon
from tests.helpers.slurm import SlurmCluster, gpu_job, job_env
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd

DATA = Path(__file__).parent / "data"
UUID_OF_MINOR = {minor: f"GPU-5e1a0000-0000-4000-8000-00000000000{minor}" for minor in range(4, 8)}


@pytest.fixture
def user_env(slurm: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    """The environment of a user on the Slurm node, outside any job: Slurm's commands, the
    node's name, a lease folder and a jobs cache of the test's own, no daemon."""
    env = {
        **slurm.env,
        "SLURMD_NODENAME": slurm.node,
        "GPUWATCH_LEASE_DIR": str(tmp_path / "leases"),
        "XDG_RUNTIME_DIR": str(tmp_path),
        "GPUWATCH_SOCKET": str(tmp_path / "no-daemon.sock"),
    }
    for name in ("SLURM_JOB_ID", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    return env


@pytest.fixture
def node_env(user_env: dict[str, str], backend: dict[str, str]) -> dict[str, str]:
    """`user_env`, reading the node's GPUs from its scenario or through NVML."""
    return {**user_env, **backend}


def pick(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuwatch pick ARGS` printing its choice (no command)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "pick", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def stopped_slurmctld(slurm: SlurmCluster) -> Iterator[None]:
    """slurmctld stopped for the test: squeue retries, past any reader's deadline."""
    slurm.stop("slurmctld")
    try:
        yield
    finally:
        slurm.restart("slurmctld")


def test_pick_without_a_daemon_never_takes_a_gpu_a_running_job_holds(
    slurm: SlurmCluster, node_env: dict[str, str]
) -> None:
    # GIVEN a running job Slurm gave 2 of the node's 4 GPUs
    job_id = gpu_job(slurm, 2)
    held = {UUID_OF_MINOR[m] for m in slurm.minors_of(job_env(slurm, job_id)["SLURM_JOB_GPUS"])}
    # WHEN pick asks for all four, then for two
    four, two = pick(node_env, "-n", "4"), pick(node_env, "-n", "2")
    # THEN four cannot be had, the job named on its GPUs; two are the other two
    assert four.returncode == 4, four.stderr
    assert four.stderr.count(f"held by job {job_id} (root)") == 2, four.stderr
    assert two.returncode == 0, two.stderr
    chosen = set(two.stdout.strip().split(","))
    assert len(chosen) == 2 and not chosen & held


def test_select_without_a_daemon_never_takes_a_gpu_a_running_job_holds(
    slurm: SlurmCluster, node_env: dict[str, str]
) -> None:
    # GIVEN a running job holding 3 of the 4 GPUs
    job_id = gpu_job(slurm, 3)
    held = {UUID_OF_MINOR[m] for m in slurm.minors_of(job_env(slurm, job_id)["SLURM_JOB_GPUS"])}
    # WHEN a script selects one GPU
    code = "import gpuwatch; print(','.join(gpuwatch.select(1).uuids))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=node_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # THEN it is the one GPU the job does not hold
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() not in held
    assert done.stdout.strip() in UUID_OF_MINOR.values()


@pytest.mark.usefixtures("stopped_slurmctld")
def test_while_slurm_does_not_answer_pick_gives_out_no_gpu_and_says_why(
    node_env: dict[str, str],
) -> None:
    # GIVEN slurmctld down: who holds the GPUs is unknown
    # WHEN pick asks for one GPU
    refused = pick(node_env)
    # THEN it takes none: exit 4, one line saying why, and how to take them anyway
    assert refused.returncode == 4, refused.stderr
    first = refused.stderr.splitlines()[0]
    assert "who holds them is unknown" in first and "Slurm did not answer within 1s" in first
    assert "--allow-unknown-holders" in first
    assert "Traceback" not in refused.stderr
    # AND told to take them anyway, it does
    taken = pick(node_env, "--allow-unknown-holders")
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.strip() in UUID_OF_MINOR.values()


def test_through_the_daemon_a_held_gpu_is_never_given_and_unknown_ones_neither(
    slurm: SlurmCluster, user_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a daemon on the Slurm node, reading its jobs, and a job holding 2 GPUs
    job_id = gpu_job(slurm, 2)
    args = ("--jobs", "slurm", "--jobs-refresh", "1s", "--node-name", slurm.node)
    (tmp_path / "daemon").mkdir()
    env = {k: v for k, v in user_env.items() if k != "GPUWATCH_SOCKET"}
    scenario = (DATA / "slurm-node.toml").read_text()
    with running_daemon(tmp_path / "daemon", *args, env=env, scenario=scenario) as (_, sock, _):
        client = {**user_env, "GPUWATCH_SOCKET": str(sock), "GPUWATCH_BACKEND": "daemon"}
        wait_until(lambda: f"job {job_id}" in pick(client, "-n", "4").stderr, "the job's GPUs")
        # WHEN pick asks it for all four THEN the job holds two of them
        four = pick(client, "-n", "4")
        assert four.returncode == 4 and four.stderr.count(f"held by job {job_id}") == 2
        # AND once slurmctld stops answering, no GPU at all, until told to take them
        slurm.stop("slurmctld")
        try:
            unknown = lambda: "who holds" in pick(client).stderr  # noqa: E731
            wait_until(unknown, "the daemon to find Slurm silent", timeout_s=60)
            assert pick(client).returncode == 4
            assert pick(client, "--allow-unknown-holders").returncode == 0
        finally:
            slurm.restart("slurmctld")
