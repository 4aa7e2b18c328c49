"""`gpuwatch job-report` against a real Slurm (Debian's slurm-wlm 22.05) and a running daemon
reading the Slurm node's GPUs through NVML from fakenvml (minor numbers 4-7, gres.conf order
7, 5, 6, 4): by hand while a job runs and after it ended, and from examples/slurm/epilog.sh
as slurm.conf's Epilog."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.slurm import GRES_ORDER, SlurmCluster, start_cluster, why_not
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd, and a daemon

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "jobs" / "data"
NODE = (DATA / "slurm-node.toml").read_text()


# As tests/contract/test_fakenvml.py finds it: $FAKENVML_DIR, else ../shared beside the checkout.
FAKENVML = Path(os.environ.get("FAKENVML_DIR", REPO.parent / "shared" / "fakenvml"))


@pytest.fixture(scope="module")
def daemon_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A daemon sampling the Slurm node's four GPUs every 0.2 s: through NVML, from
    fakenvml, where it can be built; else simulated (the same GPUs and minor numbers)."""
    directory = tmp_path_factory.mktemp("daemon")
    if not (FAKENVML / "Makefile").is_file() or not (shutil.which("make") and shutil.which("cc")):
        with running_daemon(directory, scenario=NODE) as (_, socket, _):
            yield socket
        return
    build = directory / "fakenvml"
    subprocess.run(["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True)
    socket = directory / "gpuwatch.sock"
    env = {key: value for key, value in os.environ.items() if key != "GPUWATCH_SIM"}
    env |= {"LD_LIBRARY_PATH": str(build), "FAKENVML_SCENARIO": str(DATA / "slurm-node.txt")}
    argv = [sys.executable, "-m", "gpuwatch", "daemon", "--backend", "nvml"]
    argv += ["--socket", str(socket), "--interval", "0.2s"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    ) as daemon:
        try:
            wait_until(lambda: daemon.poll() is not None or serving(socket), "the daemon to serve")
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            yield socket
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)


def serving(socket: Path) -> bool:
    return socket.exists() and get_json(socket, "/v1/health")[0] == 200


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, daemon_socket: Path
) -> Iterator[SlurmCluster]:
    """A one-node Slurm whose epilog is examples/slurm/epilog.sh, reporting to
    `ROOT/reports`, and which shows a job for 5 min after it ends."""
    reason = why_not()
    if reason is not None:
        if os.environ.get("GPUWATCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUWATCH_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    gpuwatch = root / "gpuwatch"
    gpuwatch.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuwatch "$@"\n')
    epilog = root / "epilog.sh"
    epilog.write_text(
        f"#!/bin/sh\nexport GPUWATCH={gpuwatch} GPUWATCH_SOCKET={daemon_socket} "
        f"GPUWATCH_JOB_REPORT_DIR={root / 'reports'}\n"
        f"exec {REPO / 'examples' / 'slurm' / 'epilog.sh'}\n"
    )
    for script in (gpuwatch, epilog):
        script.chmod(0o755)
    started = start_cluster(root, GRES_ORDER, oversubscribe=10, epilog=epilog, min_job_age_s=300)
    yield started
    started.close()


def gpu_job(cluster: SlurmCluster, seconds: int) -> tuple[str, tuple[int, ...]]:
    """A job of 2 GPUs sleeping `seconds`; its id, and the minor numbers of its GPUs as its
    own SLURM_JOB_GPUS names them."""
    root = cluster.root
    job_id = cluster.sbatch(
        "--gres=gpu:2", wrap=f"echo $SLURM_JOB_GPUS > {root}/gpus-$SLURM_JOB_ID; sleep {seconds}"
    )
    gpus = root / f"gpus-{job_id}"
    wait_until(lambda: gpus.exists() and gpus.read_text().endswith("\n"), "the job's GPUs")
    return job_id, cluster.minors_of(gpus.read_text().strip())


def job_report(
    cluster: SlurmCluster, socket: Path, job_id: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "job-report", job_id, "--json", "--socket", str(socket)],
        env={**cluster.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def reported_minors(done: subprocess.CompletedProcess[str]) -> list[int]:
    assert done.returncode == 0, done.stderr
    return sorted(gpu["minor_number"] for gpu in json.loads(done.stdout)["gpus"])


def test_a_running_jobs_report_has_the_gpus_slurm_gave_it(
    cluster: SlurmCluster, daemon_socket: Path
) -> None:
    # GIVEN a running job of 2 GPUs
    job_id, minors = gpu_job(cluster, 60)
    try:
        # WHEN its report is asked on the node
        done = job_report(cluster, daemon_socket, job_id)
        # THEN it reports those two GPUs, read from scontrol, up to now
        assert reported_minors(done) == sorted(minors)
        report = json.loads(done.stdout)
        assert report["running"] and report["gpus_source"] == "scontrol"
    finally:
        cluster.cancel_all()


def test_a_finished_jobs_report_is_written_by_the_epilog(
    cluster: SlurmCluster, daemon_socket: Path
) -> None:
    # GIVEN a job of 2 GPUs that ran 5 s and ended
    job_id, minors = gpu_job(cluster, 5)
    cluster.wait_gone([job_id])
    # WHEN Slurm ran the epilog
    report = cluster.root / "reports" / f"{job_id}.txt"
    wait_until(lambda: report.exists() and report.stat().st_size > 0, "the epilog's report")
    # THEN the report is the job's, with a row for each of its two GPUs (NVML index = minor - 4)
    head, _, *rows = report.read_text().splitlines()
    assert head.startswith(f"job {job_id} on {cluster.node}: ") and "SLURM_JOB_GPUS" in head
    indices = [int(row.split()[0]) for row in rows if row.split()[0].isdigit()]
    assert sorted(indices) == sorted(minor - 4 for minor in minors)


def test_after_the_job_its_gpus_are_known_only_from_its_own_variables(
    cluster: SlurmCluster, daemon_socket: Path
) -> None:
    # GIVEN a job of 2 GPUs that ended, which scontrol still shows
    job_id, minors = gpu_job(cluster, 2)
    cluster.wait_gone([job_id])
    # WHEN its report is asked by hand THEN it says plainly that its GPUs are no longer known
    done = job_report(cluster, daemon_socket, job_id)
    assert done.returncode == 7
    assert f"Slurm no longer says which GPUs job {job_id} held" in done.stderr
    # AND given its SLURM_JOB_GPUS (as its epilog is), it reports those GPUs over its run
    indices = ",".join(str(GRES_ORDER.index(minor)) for minor in minors)
    given = job_report(cluster, daemon_socket, job_id, SLURM_JOB_ID=job_id, SLURM_JOB_GPUS=indices)
    assert reported_minors(given) == sorted(minors)
    assert not json.loads(given.stdout)["running"]


def test_a_job_slurm_does_not_know_is_said_to_be_unknown(
    cluster: SlurmCluster, daemon_socket: Path
) -> None:
    done = job_report(cluster, daemon_socket, "999999")
    assert done.returncode == 7
    assert "Slurm knows no job 999999" in done.stderr
    assert "Slurm accounting storage is disabled" in done.stderr
