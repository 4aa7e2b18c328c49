"""Real exporters' pages (tests/fleet/data/recorded, each with its source), served to both
read paths: scraped directly, and through a real Prometheus, plainly and as Kubernetes
scrapes them. Both paths tell the same node; a MIG-enabled GPU is never whole; MIG
devices go by their GPU instance where no UUID is told, and are unknown where no device
is; a pod holds its GPU, the exporter pod's own labels hold none; a node is never named
after a pod; a target never up is a node, down with why."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.placement.where import needs_of, where
from gpuwatch.request import Request
from tests.helpers.fleet.recorded import DCGM_PAGES, KUBERNETES_PAGES, SMI_PAGES, RecordedFleet

pytestmark = pytest.mark.slow
GIB = 1 << 30
MIB = 1 << 20
LKE_POD = ("default", "cuda-75454ffb9f-8ljq7", "cuda")


def direct(recorded: RecordedFleet, page: str) -> NodeState:
    (node,) = ScrapeSource([recorded.pages[page].address]).read().nodes
    return node


def through(recorded: RecordedFleet, needs: Needs | None = None) -> FleetState:
    return PrometheusSource(recorded.prometheus.url, needs=needs).read()


def node_of(fleet: FleetState, recorded: RecordedFleet, page: str, job: str = "") -> NodeState:
    """The node of `page`'s target in `job` (by default, the job scraping it plainly)."""
    job = job or recorded.job_of(page)
    address = recorded.pages[page].address
    (node,) = [n for n in fleet.nodes if n.job == job and n.target.endswith(address)]
    return node


def told(node: NodeState) -> dict[str, Any]:
    """What a node says of itself that both paths read alike (not its age, nor where)."""
    snapshot = node.snapshot
    assert snapshot is not None, node.error
    return {
        "name": node.name,
        "exporter": node.exporter,
        "driver": snapshot.driver_version,
        "gpus": snapshot.gpus,
        "mig_devices": snapshot.mig_devices,
        "processes": snapshot.processes,
        "pods": node.pods,
        "holders": node.holders,
        "mig_devices_known": node.mig_devices_known,
    }


@pytest.mark.parametrize("page", [*DCGM_PAGES, *SMI_PAGES])
def test_a_page_through_prometheus_is_the_node_scraped_directly(
    recorded: RecordedFleet, page: str
) -> None:
    # GIVEN a recorded exporter page, served
    # WHEN it is scraped directly, and read through Prometheus, which scraped it
    scraped = direct(recorded, page)
    fleet = through(recorded)
    # THEN both tell the same node: its GPUs, MIG devices, processes and pods
    assert told(node_of(fleet, recorded, page)) == told(scraped)


@pytest.mark.parametrize("job", ["dcgm-k8s", "dcgm-k8s-honor"])
def test_a_pod_holds_its_gpu_and_the_exporter_pods_own_labels_hold_none(
    recorded: RecordedFleet, job: str
) -> None:
    # GIVEN pages scraped as Kubernetes does, the exporter pod's own pod, namespace and
    # container on every series (renamed exported_* where the page has its own, or not)
    fleet = through(recorded)
    # WHEN a page where a pod holds the GPU, and one where none does, are read
    held = node_of(fleet, recorded, KUBERNETES_PAGES[0], job)
    free = node_of(fleet, recorded, KUBERNETES_PAGES[1], job)
    # THEN the pod holds its GPU, the exporter pod holds nothing
    assert [(p.gpu_index, p.namespace, p.pod, p.container) for p in held.pods] == [(0, *LKE_POD)]
    assert free.pods == ()
    # AND where never offers the pod's GPU, saying who holds it; the other is offered
    answer = where(fleet, Request(allow_busy=True))
    assert held.label not in [fit.node for fit in answer.fits]
    (miss,) = [m for m in answer.misses if m.node == held.label]
    assert f"GPU 0: held by pod {LKE_POD[0]}/{LKE_POD[1]} (container cuda)" in miss.reasons
    assert free.label in [fit.node for fit in answer.fits]


def test_pods_hold_only_the_gpus_labelled_with_them(recorded: RecordedFleet) -> None:
    # GIVEN an H100 node whose GPU 0 a pod holds, and GPUs 1 and 2 no pod
    node = node_of(through(recorded), recorded, "dcgm-exporter_issue490_h100-pod_excerpt.prom")
    # THEN the pod holds GPU 0 alone
    assert [(p.gpu_index, p.name) for p in node.pods] == [(0, "default/dcgmproftester2")]


def test_a_mig_enabled_gpu_of_dcgm_exporter_2x_is_never_given_whole(
    recorded: RecordedFleet,
) -> None:
    # GIVEN dcgm-exporter 2.x on an A100 in MIG mode: 35690 MiB free on the whole GPU, its
    # one MIG device without memory series
    page = "dcgm-exporter-2x_nvidia-docs_a100-mig.prom"
    for request in (Request(mem_bytes=10 * GIB), Request(mig="any")):
        # WHEN where reads it for a shared GPU with 10 GiB, or any MIG device
        fleet = through(recorded, needs_of(request))
        node = node_of(fleet, recorded, page)
        answer = where(FleetState(fleet.taken_at, fleet.source, (node,)), request)
        # THEN nothing is offered: the GPU is MIG-enabled, its device's memory unknown
        assert answer.fits == ()
        (miss,) = answer.misses
        assert miss.reasons == (
            ("GPU 0: MIG enabled: it is given out only as MIG devices (use --mig PROFILE|any)",)
            if request.mig is None
            else ("MIG 0:0 (1g.5gb): free memory unknown",)
        )


@pytest.mark.parametrize("read", ["direct", "prometheus"])
def test_dcgm_exporters_mig_devices_are_placed_by_gpu_instance_with_their_memory(
    recorded: RecordedFleet, read: str
) -> None:
    # GIVEN two A30 split into 1g.6gb MIG devices, each with its memory (6012 MiB free),
    # dcgm-exporter telling no MIG device's UUID
    page = "dcgm-exporter_issue317_a30-mig_excerpt.prom"
    request = Request(mig="any", count=2)
    node = (
        direct(recorded, page)
        if read == "direct"
        else node_of(through(recorded, needs_of(request)), recorded, page)
    )
    # WHEN where asks for two MIG devices
    (fit,) = where(FleetState(0.0, "x", (node,)), request).fits
    # THEN two are given, each named by its GPU and GPU instance, with its free memory
    assert [(d.gpu_index, d.gpu_instance_id, d.uuid) for d in fit.devices] == [
        (0, 3, None),
        (0, 4, None),
    ]
    assert fit.free_bytes == (6012 * MIB, 6012 * MIB)


def test_a_node_is_never_named_after_the_exporters_pod(recorded: RecordedFleet) -> None:
    # GIVEN dcgm-exporter run without NODE_NAME: its hostname label is its pod's name,
    # and a MIG device on its A30 is held by a pod
    page = "dcgm-exporter-4x_pr736_mixed-mig-pod_excerpt.prom"
    # WHEN it is read both ways
    for node in (direct(recorded, page), node_of(through(recorded), recorded, page)):
        # THEN it is named by its target, never dcgm-exporter-wwwjh; the pod holds the
        # device of GPU instance 3 of GPU 2
        assert node.name == "127.0.0.1"
        assert [(p.gpu_index, p.gpu_instance_id, p.name) for p in node.pods] == [
            (2, 3, "default/triton-server-f7cb5d77-95xcf")
        ]


@pytest.mark.parametrize("page", ["nvidia-gpu-exporter_h100-mig_idle.prom"])
def test_mig_devices_an_exporter_cannot_tell_are_unknown_not_none(
    recorded: RecordedFleet, page: str
) -> None:
    # GIVEN nvidia_gpu_exporter on an H100 in MIG mode, which tells no MIG device
    request = Request(mig="any")
    node = node_of(through(recorded, needs_of(request)), recorded, page)
    # WHEN where asks for a MIG device, or a whole GPU
    (miss,) = where(FleetState(0.0, "x", (node,)), request).misses
    (whole,) = where(FleetState(0.0, "x", (node,)), Request(allow_busy=True)).misses
    # THEN its MIG devices are unknown, not none; the GPU is never given whole
    assert node.mig_devices_known is False
    assert miss.summary.startswith("MIG devices unknown: GPU 0 MIG-enabled")
    assert "MIG enabled" in whole.reasons[0]


def test_targets_never_up_are_nodes_down_with_prometheus_reason(recorded: RecordedFleet) -> None:
    # GIVEN two targets of dcgm-exporter's job where nothing ever listened
    fleet = through(recorded)
    # WHEN the fleet is read THEN each is a node, down, with why Prometheus cannot scrape it
    for endpoint in recorded.never_up:
        (node,) = [n for n in fleet.nodes if n.target == endpoint.address]
        assert (node.name, node.up, node.snapshot, node.job) == (
            endpoint.address,
            False,
            None,
            "dcgm",
        )
        assert node.error is not None and "connection refused" in node.error


WINDOWS = "nvidia-gpu-exporter_windows_rtx2080super_idle.prom"


@pytest.mark.parametrize("read", ["direct", "prometheus"])
def test_a_gpu_whose_processes_tell_no_memory_is_in_use_and_never_offered(
    recorded: RecordedFleet, read: str
) -> None:
    # GIVEN nvidia_gpu_exporter on Windows: 19 compute apps, none with its memory told, on a
    # GPU otherwise idle (835 MB used, 0% busy)
    request = Request()
    node = (
        direct(recorded, WINDOWS)
        if read == "direct"
        else node_of(through(recorded, needs_of(request)), recorded, WINDOWS)
    )
    assert node.snapshot is not None
    assert len(node.snapshot.processes) == 19
    assert all(p.memory_used_bytes is None for p in node.snapshot.processes)
    # WHEN where is asked for an idle GPU THEN it is not offered: in use by those processes
    answer = where(FleetState(0.0, "t", (node,)), request)
    assert answer.fits == ()
    assert answer.misses[0].reasons[0].startswith("GPU 0: in use by pids ")
