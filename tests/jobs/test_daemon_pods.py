"""A real daemon on a Kubernetes node: it reads from a kubelet stand-in which pods hold its
simulated GPUs (pods on 2 of 4 GPUs and on a MIG device, the UUIDs matching), and shows them
in /v1/jobs, `gpuwatch status`, /metrics; `gpuwatch pick` never takes their GPUs. A kubelet
that is slow or absent makes every GPU's holders unknown: none is given out."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import Snapshot
from tests.helpers.cli import run_cli, under
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.k8s_node import NODE, node_pods
from tests.helpers.kubelet import Kubelet, kubelet_stand_in
from tests.helpers.wait import wait_until


@pytest.fixture
def node(tmp_path: Path) -> Snapshot:
    """The node's GPUs as the daemon will see them (the simulation is the same anywhere)."""
    (tmp_path / "sim.toml").write_text(NODE)
    return SimBackend(tmp_path / "sim.toml").sample()


@pytest.fixture
def kubelet(node: Snapshot) -> Iterator[Kubelet]:
    """Pod ml/train-0 on GPUs 1 and 2, pod serving/infer-7 on GPU 3's second MIG device."""
    with kubelet_stand_in(*node_pods(node)) as stand_in:
        yield stand_in


@pytest.fixture
def daemon(tmp_path: Path, kubelet: Kubelet, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A daemon asking the kubelet every second, its socket the one clients find; yields
    the socket once the pods are known."""
    args = ("--jobs", "kubernetes", "--pod-resources-socket", kubelet.socket_path)
    (tmp_path / "daemon").mkdir()
    with running_daemon(tmp_path / "daemon", *args, "--jobs-refresh", "1s", scenario=NODE) as (
        _,
        sock,
        _,
    ):
        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(tmp_path / "leases"))
        wait_until(lambda: jobs_of(sock)["known"], "the pods to be known")
        yield sock


def jobs_of(sock: Path) -> dict[str, Any]:
    status, body = get_json(sock, "/v1/jobs")
    assert status == 200
    return body  # type: ignore[no-any-return]


def metrics_of(sock: Path) -> dict[str, list[Any]]:
    status, body = http_get(str(sock), "/metrics")
    assert status == 200
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def test_the_jobs_route_names_each_pod_and_the_devices_it_holds(
    daemon: Path, node: Snapshot
) -> None:
    body = jobs_of(daemon)
    assert body["source"] == "kubelet pod-resources"
    held = {job["job_id"]: (job["pod"], job["device_uuids"]) for job in body["jobs"]}
    gpus, migs = node.gpus, node.mig_devices
    assert held == {
        "ml/train-0": (
            {"namespace": "ml", "name": "train-0", "container": "trainer"},
            [gpus[1].uuid, gpus[2].uuid],
        ),
        "serving/infer-7": (
            {"namespace": "serving", "name": "infer-7", "container": "server"},
            [migs[1].uuid],
        ),
    }


def test_status_shows_the_pod_under_each_gpu_it_holds(daemon: Path) -> None:
    # WHEN status is shown (through the daemon, as on any node that runs one)
    result = run_cli("status")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # THEN GPUs 1 and 2 name the pod holding them, where a Slurm job would be named
    assert under(lines, 0) == []
    for index in (1, 2):
        assert under(lines, index)[0].startswith("  pod ml/train-0 (container trainer)"), lines
    assert "jobs unknown" not in result.stdout


def test_status_json_lists_the_pods_with_their_gpus_and_mig_devices(
    daemon: Path, node: Snapshot
) -> None:
    data = json.loads(run_cli("status", "--json").stdout)
    assert [gpu["job_id"] for gpu in data["gpus"]] == [None, "ml/train-0", "ml/train-0", None]
    jobs = {job["job_id"]: job for job in data["jobs"]}
    assert jobs["ml/train-0"]["gpus"] == [1, 2]
    assert jobs["ml/train-0"]["pod"]["container"] == "trainer"
    assert jobs["serving/infer-7"]["mig_uuids"] == [node.mig_devices[1].uuid]
    assert data["jobs_error"] is None


def test_metrics_name_the_pod_on_each_device_it_holds_and_give_none_of_them_out(
    daemon: Path, node: Snapshot
) -> None:
    metrics = metrics_of(daemon)
    pods = {
        s.labels["uuid"]: (
            s.labels["gpu"],
            s.labels["namespace"],
            s.labels["pod"],
            s.labels["container"],
        )
        for s in metrics["gpuwatch_gpu_pod_info"]
    }
    gpus, migs = node.gpus, node.mig_devices
    assert pods == {
        gpus[1].uuid: ("1", "ml", "train-0", "trainer"),
        gpus[2].uuid: ("2", "ml", "train-0", "trainer"),
        migs[1].uuid: ("3:1", "serving", "infer-7", "server"),
    }
    # AND no Slurm job is said to hold anything, while the jobs are known
    assert not metrics["gpuwatch_gpu_job_info"]
    assert metrics["gpuwatch_jobs_known"][0].value == 1
    # AND `where` (which reads pick's verdict from the metrics) is given GPU 0 alone
    available = {s.labels["gpu"]: s.value for s in metrics["gpuwatch_memory_available_bytes"]}
    assert available["0"] > 0 and available["1"] == available["2"] == available["3"] == 0
    assert metrics["gpuwatch_gpus_available"][0].value == 1


def test_pick_never_takes_a_gpu_a_pod_holds(daemon: Path, node: Snapshot) -> None:
    # WHEN two whole GPUs are asked for, where pods hold two of the three whole ones
    refused = run_cli("pick", "-n", "2")
    # THEN pick refuses, saying who holds them
    assert refused.exit_code == 4, refused.stderr
    assert "GPU 1: held by pod ml/train-0 (container trainer)" in refused.stderr
    assert "GPU 2: held by pod ml/train-0 (container trainer)" in refused.stderr
    # AND one GPU is the free one
    picked = run_cli("pick")
    assert picked.exit_code == 0, picked.stderr
    assert picked.stdout.strip() == node.gpus[0].uuid


def test_pick_never_takes_a_mig_device_a_pod_holds(daemon: Path, node: Snapshot) -> None:
    # WHEN MIG devices are asked for: the first is free, a pod holds the second
    refused = run_cli("pick", "--mig", "any", "-n", "2")
    assert refused.exit_code == 4, refused.stderr
    assert "held by pod serving/infer-7 (container server)" in refused.stderr
    picked = run_cli("pick", "--mig", "any")
    assert picked.exit_code == 0, picked.stderr
    assert picked.stdout.strip() == node.mig_devices[0].uuid


def test_a_pod_that_ends_frees_its_gpus(daemon: Path, kubelet: Kubelet, node: Snapshot) -> None:
    # WHEN the training pod ends
    kubelet.pods = kubelet.pods[1:]
    # THEN within a refresh its GPUs are free again: in the API, the metrics, and to pick
    wait_until(
        lambda: [job["job_id"] for job in jobs_of(daemon)["jobs"]] == ["serving/infer-7"],
        "the pod to be gone",
    )
    assert len(metrics_of(daemon)["gpuwatch_gpu_pod_info"]) == 1
    picked = run_cli("pick", "-n", "2")
    assert picked.exit_code == 0, picked.stderr


def test_a_slow_kubelet_delays_neither_snapshots_nor_metrics(
    tmp_path: Path, kubelet: Kubelet
) -> None:
    # GIVEN a kubelet that does not answer
    kubelet.slow()
    args = ("--jobs", "kubernetes", "--pod-resources-socket", kubelet.socket_path)
    with running_daemon(tmp_path, *args, "--jobs-refresh", "1s", scenario=NODE) as (_, sock, _):
        wait_until(lambda: kubelet.calls >= 1, "the kubelet to be asked")
        # WHEN clients ask meanwhile THEN they are answered at once, GPUs and all
        began = time.monotonic()
        status, snapshot = get_json(sock, "/v1/snapshot")
        metrics = metrics_of(sock)
        assert time.monotonic() - began < 2.0
        assert status == 200 and len(snapshot["gpus"]) == 4
        assert metrics["gpuwatch_jobs_known"][0].value == 0
        # AND once its deadline passed, the pods are unknown, saying why
        late = lambda: "did not answer" in (jobs_of(sock)["error"] or "")  # noqa: E731
        wait_until(late, "the deadline to pass")
        assert jobs_of(sock)["error"] == "the kubelet did not answer within 5s"
        kubelet.release()


def test_an_absent_socket_makes_the_holders_unknown_and_gives_no_gpu_out(tmp_path: Path) -> None:
    # GIVEN a daemon told to read a kubelet that is not there
    socket_path = str(tmp_path / "kubelet.sock")
    args = ("--jobs", "kubernetes", "--pod-resources-socket", socket_path)
    with running_daemon(tmp_path, *args, scenario=NODE) as (_, sock, _):
        # THEN it serves its GPUs, and says why the pods are unknown
        assert len(get_json(sock, "/v1/snapshot")[1]["gpus"]) == 4
        body = wait_until(lambda: (b := jobs_of(sock))["error"] and b, "the reason")
        assert body["known"] is False and body["reading"] is True
        assert body["error"] == f"no kubelet pod-resources socket at {socket_path}"
        # AND gives no GPU out: a pod may hold any of them (fail closed)
        metrics = metrics_of(sock)
        assert metrics["gpuwatch_holders_known"][0].value == 0
        assert metrics["gpuwatch_gpus_available"][0].value == 0
