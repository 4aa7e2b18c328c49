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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm without accounting whose epilog is examples/slurm/epilog.sh,
    reporting to `ROOT/reports` through the daemon at `ROOT/gpuwatch.sock`, and which
    forgets a job 2 s after it ends."""
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
        f"#!/bin/sh\nexport GPUWATCH={gpuwatch} GPUWATCH_SOCKET={root / 'gpuwatch.sock'} "
        f"GPUWATCH_JOB_REPORT_DIR={root / 'reports'}\n"
        f"exec {REPO / 'examples' / 'slurm' / 'epilog.sh'}\n"
    )
    for script in (gpuwatch, epilog):
        script.chmod(0o755)
    started = start_cluster(root, GRES_ORDER, oversubscribe=10, epilog=epilog, min_job_age_s=2)
    yield started
    started.close()


@pytest.fixture(scope="module")
def daemon_socket(cluster: SlurmCluster) -> Iterator[Path]:
    """A daemon on the Slurm node, sampling its four GPUs every 0.2 s (through NVML, from
    fakenvml, where it can be built; else simulated: the same GPUs and minor numbers) and
    reading the cluster's jobs every second."""
    socket = cluster.root / "gpuwatch.sock"
    jobs = ["--jobs", "slurm", "--slurm-conf", str(cluster.conf), "--jobs-refresh", "1s"]
    if not (FAKENVML / "Makefile").is_file() or not (shutil.which("make") and shutil.which("cc")):
        # The daemon's socket where the epilog looks (a link to it would not do: a client
        # trusts no symbolic link in the socket's place)
        with running_daemon(cluster.root, *jobs, env=cluster.env, scenario=NODE) as (_, made, _):
            assert made == socket
            yield socket
        return
    build = cluster.root / "fakenvml"
    subprocess.run(["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True)
    env = {key: value for key, value in cluster.env.items() if key != "GPUWATCH_SIM"}
    env |= {"LD_LIBRARY_PATH": str(build), "FAKENVML_SCENARIO": str(DATA / "slurm-node.txt")}
    argv = [sys.executable, "-m", "gpuwatch", "daemon", "--backend", "nvml", *jobs]
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
        # THEN it reports those two GPUs, read from Slurm, up to now
        assert reported_minors(done) == sorted(minors)
        report = json.loads(done.stdout)
        assert report["running"] and report["gpus_source"] == "squeue --json"
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
    text = report.read_text()
    assert len(text.splitlines()) > 2, text
    head, _, *rows = text.splitlines()
    assert head.startswith(f"job {job_id} on {cluster.node}: ") and "SLURM_JOB_GPUS" in head
    indices = [int(row.split()[0]) for row in rows if row.split()[0].isdigit()]
    assert sorted(indices) == sorted(minor - 4 for minor in minors)


def held_by_daemon(socket: Path, job_id: str) -> dict[str, Any] | None:
    """The daemon's memory of the job, once it has one."""
    _, body = get_json(socket, f"/v1/jobs/seen?job_id={job_id}")
    return body["job"] if body["seen"] else None


def test_job_report_10_s_after_scancel_without_accounting(
    cluster: SlurmCluster, daemon_socket: Path
) -> None:
    # GIVEN a job of 2 GPUs the daemon saw running, cancelled (Slurm keeps no accounting,
    # and forgets the job's GPUs as it ends)
    job_id, minors = gpu_job(cluster, 300)
    seen = wait_until(lambda: held_by_daemon(daemon_socket, job_id), "the daemon to see the job")
    assert tuple(seen["gpu_minor_numbers"]) == minors
    cluster.run("scancel", job_id)
    cancelled_at = time.monotonic()
    wait_until(
        lambda: (held_by_daemon(daemon_socket, job_id) or {}).get("gone_at"),
        "the daemon to see the job gone",
    )
    wait_until(lambda: time.monotonic() - cancelled_at >= 10, "10 s since scancel")
    # WHEN its report is asked by hand, the way people run seff
    done = job_report(cluster, daemon_socket, job_id)
    # THEN it reports the job's two GPUs, from the daemon's memory, as a job that ended
    assert reported_minors(done) == sorted(minors)
    report = json.loads(done.stdout)
    assert report["gpus_source"] == "the daemon's memory" and not report["running"]


def test_in_its_epilog_a_job_names_its_own_gpus(cluster: SlurmCluster, daemon_socket: Path) -> None:
    # GIVEN a job of 2 GPUs that ended
    job_id, minors = gpu_job(cluster, 2)
    cluster.wait_gone([job_id])
    # WHEN its report is asked with its SLURM_JOB_GPUS (as its epilog is)
    indices = ",".join(str(GRES_ORDER.index(minor)) for minor in minors)
    given = job_report(cluster, daemon_socket, job_id, SLURM_JOB_ID=job_id, SLURM_JOB_GPUS=indices)
    # THEN it reports those GPUs over its run
    assert reported_minors(given) == sorted(minors)
    assert json.loads(given.stdout)["gpus_source"] == "SLURM_JOB_GPUS"


@pytest.mark.parametrize("job_id", ["999999", "1_2"], ids=["job", "array-task"])
def test_a_job_never_seen_is_said_to_be_so(
    cluster: SlurmCluster, daemon_socket: Path, job_id: str
) -> None:
    # GIVEN a job neither Slurm nor the daemon knows WHEN its report is asked
    done = job_report(cluster, daemon_socket, job_id)
    # THEN one plain line says so, and the exit code is 7
    assert done.returncode == 7, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"job {job_id} was never seen: Slurm knows no job {job_id}" in line
    assert "the daemon never saw it" in line


def test_without_slurm_on_the_node_the_reason_is_plain(
    cluster: SlurmCluster, daemon_socket: Path, tmp_path: Path
) -> None:
    # GIVEN a node without Slurm's commands (a PATH without them, no slurm.conf)
    env = {key: value for key, value in cluster.env.items() if not key.startswith("SLURM")}
    env["PATH"] = str(Path(sys.executable).parent)
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "job-report", "12345", "--socket", str(daemon_socket)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # THEN it says there is no Slurm to ask, and that the daemon never saw the job: exit 7
    assert done.returncode == 7, done.stderr
    (line,) = done.stderr.splitlines()
    assert "there is no Slurm on this node to ask" in line and "error:" not in line[17:]
