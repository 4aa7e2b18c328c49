"""The daemon against a real Slurm (tests/helpers/slurm.py): /metrics names the job on
exactly the GPUs Slurm gave it, forgets it when it ends, and goes on when Slurm stops.

The daemon samples a simulated node whose GPUs have the device-file minor numbers of the
cluster's gres.conf (4-7, listed 7, 5, 6, 4), so a job's GPUs are matched by minor number
as on a real node, never by index."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.slurm import SlurmCluster
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd, and a daemon

NODE = (Path(__file__).parent / "data" / "slurm-node.toml").read_text()
SLURM_TIMEOUT_S = 60.0  # the test machine's two cores are shared: Slurm may be slow to start jobs


@pytest.fixture
def daemon(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Path]:
    """A daemon on the cluster's node, asking Slurm every second; yields its socket."""
    args = ("--jobs", "slurm", "--slurm-conf", str(slurm.conf), "--jobs-refresh", "1s")
    env = {"PATH": slurm.env["PATH"], "SLURMD_NODENAME": slurm.node}
    with running_daemon(tmp_path, *args, env=env, scenario=NODE) as (_, sock, _):
        yield sock


def gpu_job(cluster: SlurmCluster, gpus: int) -> tuple[str, tuple[int, ...]]:
    """A running job holding `gpus` GPUs; its id, and the minor numbers Slurm gave it (from
    the job's own SLURM_JOB_GPUS)."""
    root = cluster.root
    job_id = cluster.sbatch(
        f"--gres=gpu:{gpus}", wrap=f"echo $SLURM_JOB_GPUS > {root}/gpus-$SLURM_JOB_ID; sleep 120"
    )
    cluster.wait_running([job_id], timeout_s=SLURM_TIMEOUT_S)
    path = root / f"gpus-{job_id}"
    text = wait_until(lambda: path.exists() and path.read_text().strip(), f"job {job_id}'s GPUs")
    return job_id, cluster.minors_of(text)


def jobs_on_minors(sock: Path) -> dict[int, str]:
    """The job /metrics names on each GPU, by the GPU's minor number."""
    minors = {gpu["uuid"]: gpu["minor_number"] for gpu in get_json(sock, "/v1/snapshot")[1]["gpus"]}
    status, body = http_get(str(sock), "/metrics")
    assert status == 200
    info = next(
        f
        for f in text_string_to_metric_families(body.decode())
        if f.name == "gpuwatch_gpu_job_info"
    )
    return {minors[sample.labels["uuid"]]: sample.labels["job_id"] for sample in info.samples}


def jobs_known(sock: Path) -> float:
    status, body = http_get(str(sock), "/metrics")
    assert status == 200
    families = text_string_to_metric_families(body.decode())
    return next(f.samples[0].value for f in families if f.name == "gpuwatch_jobs_known")


def test_metrics_name_each_job_on_exactly_the_gpus_slurm_gave_it(
    slurm: SlurmCluster, daemon: Path
) -> None:
    # GIVEN a job Slurm gave 2 GPUs
    first, first_gpus = gpu_job(slurm, 2)
    # THEN /metrics names it on exactly those GPUs, by minor number
    expected = dict.fromkeys(first_gpus, first)
    wait_until(lambda: jobs_on_minors(daemon) == expected, f"job {first} on {first_gpus}")
    # WHEN a second job gets one more GPU
    second, second_gpus = gpu_job(slurm, 1)
    assert not set(first_gpus) & set(second_gpus)
    # THEN each job is named on its own GPUs
    expected |= dict.fromkeys(second_gpus, second)
    wait_until(lambda: jobs_on_minors(daemon) == expected, "both jobs on their GPUs")
    # WHEN the first job ends
    slurm.run("scancel", first)
    slurm.wait_gone([first], timeout_s=SLURM_TIMEOUT_S)
    # THEN its series are gone, and the second job's stay
    wait_until(lambda: jobs_on_minors(daemon) == dict.fromkeys(second_gpus, second), "job gone")


def test_when_slurm_stops_the_daemon_goes_on_with_jobs_unknown(
    slurm: SlurmCluster, daemon: Path
) -> None:
    # GIVEN the daemon knowing a job
    job, gpus = gpu_job(slurm, 1)
    wait_until(lambda: jobs_on_minors(daemon) == dict.fromkeys(gpus, job), "the job seen")
    # WHEN slurmctld stops
    slurm.stop("slurmctld")
    try:
        # THEN the jobs become unknown and no GPU is said to be held
        wait_until(lambda: jobs_known(daemon) == 0, "jobs unknown", timeout_s=SLURM_TIMEOUT_S)
        assert jobs_on_minors(daemon) == {}
        body = get_json(daemon, "/v1/jobs")[1]
        assert body["known"] is False and body["error"]
        # AND sampling and the API go on
        samples = get_json(daemon, "/v1/health")[1]["samples"]
        wait_until(lambda: get_json(daemon, "/v1/health")[1]["samples"] > samples, "a sample")
        assert get_json(daemon, "/v1/snapshot")[0] == 200
    finally:
        slurm.restart("slurmctld")
    # AND once Slurm is back, so are the jobs
    wait_until(lambda: jobs_known(daemon) == 1, "jobs known again", timeout_s=SLURM_TIMEOUT_S)


FORGED_NAME = "x UserId=alice(1000) JobState=RUNNING GRES=gpu:4(IDX:0-3)"
"""Issue 28's job name: key=value text a text parser would read as the job's."""
OLD_SQUEUE = """#!/bin/sh
case "$1" in --json) echo "squeue: unrecognized option '--json'" >&2; exit 1 ;; esac
exec {squeue} "$@"
"""


@pytest.fixture(params=["json", "old-squeue"])
def any_squeue(request: pytest.FixtureRequest, slurm: SlurmCluster, tmp_path: Path) -> str:
    """The PATH the daemon finds Slurm on: the real squeue (with --json), or one that
    refuses --json as Slurm before 21.08 does, then runs the real one."""
    if request.param == "json":
        return slurm.env["PATH"]
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "squeue").write_text(OLD_SQUEUE.format(squeue=shutil.which("squeue")))
    (folder / "squeue").chmod(0o755)
    return f"{folder}:{slurm.env['PATH']}"


def test_a_job_name_cannot_give_a_job_other_gpus_or_another_user(
    slurm: SlurmCluster, tmp_path: Path, any_squeue: str
) -> None:
    # GIVEN a job of 1 GPU whose name carries UserId=, JobState= and GRES= text, and a
    # pending job named the same way (the node's GPUs are all held by a job of 3)
    holder, holder_gpus = gpu_job(slurm, 3)
    forged = slurm.sbatch("--gres=gpu:1", f"--job-name={FORGED_NAME}", wrap="sleep 120")
    slurm.wait_running([forged], timeout_s=SLURM_TIMEOUT_S)
    pending = slurm.sbatch("--gres=gpu:4", f"--job-name={FORGED_NAME}", wrap="sleep 120")
    # WHEN a daemon reads the jobs (through squeue --json, or an old squeue's rows)
    args = ("--jobs", "slurm", "--slurm-conf", str(slurm.conf), "--jobs-refresh", "1s")
    env = {"PATH": any_squeue, "SLURMD_NODENAME": slurm.node}
    with running_daemon(tmp_path, *args, env=env, scenario=NODE) as (_, sock, _):
        table = wait_until(
            lambda: (body := get_json(sock, "/v1/jobs")[1])["known"] and body, "jobs known"
        )
        # THEN the job holds its one GPU, as root's, its name shown as data
        jobs = {job["job_id"]: job for job in table["jobs"]}
        assert set(jobs) == {holder, forged}, "the pending job shows as running"
        free = set(slurm.gpu_minors) - set(holder_gpus)
        assert jobs[forged]["gpu_minor_numbers"] == sorted(free)
        assert jobs[forged]["user"] == "root" and jobs[forged]["name"] == FORGED_NAME
        assert pending not in jobs
        # AND /metrics gives each GPU to its own job only
        expected = dict.fromkeys(holder_gpus, holder) | dict.fromkeys(free, forged)
        assert jobs_on_minors(sock) == expected


def test_a_node_name_slurm_does_not_know_makes_the_jobs_unknown_saying_why(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # GIVEN a job on the node, and a daemon told another node name than Slurm's
    gpu_job(slurm, 1)
    args = ("--jobs", "slurm", "--slurm-conf", str(slurm.conf), "--node-name", "not-this-node")
    env = {"PATH": slurm.env["PATH"]}
    with running_daemon(tmp_path, *args, env=env, scenario=NODE) as (_, sock, _):
        # WHEN it reads the jobs THEN they are unknown (never "known, with 0 jobs"), saying why
        body = wait_until(
            lambda: (
                (b := get_json(sock, "/v1/jobs")[1])["error"]
                != "the scheduler has not answered yet"
                and b
            ),
            "the first read of the jobs",
        )
        assert body["known"] is False
        assert "defines no node named not-this-node" in body["error"]
        assert jobs_known(sock) == 0


def test_the_node_name_given_to_the_daemon_is_slurms(slurm: SlurmCluster, tmp_path: Path) -> None:
    # GIVEN a daemon whose host name is not the node's (a container), told the node's name
    job, gpus = gpu_job(slurm, 1)
    args = ("--jobs", "slurm", "--slurm-conf", str(slurm.conf), "--node-name", slurm.node)
    env = {"PATH": slurm.env["PATH"]}  # no SLURMD_NODENAME, and a host name not the node's
    with running_daemon(tmp_path, *args, env=env, scenario=NODE) as (_, sock, _):
        # THEN it sees the node's job on its GPU
        wait_until(lambda: jobs_on_minors(sock) == dict.fromkeys(gpus, job), "the job seen")
