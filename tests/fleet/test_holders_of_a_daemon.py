"""Who holds each device, as a real daemon on a Kubernetes node builds it and the fleet reads
it back: scraped directly and through a real Prometheus, the same answer. The daemon reads a
kubelet stand-in (pod-resources v1 over gRPC): a pod on GPUs 1 and 2, another on the second
MIG device of GPU 3. `where` never offers what a pod holds, and while the kubelet hangs it
offers nothing of the node, saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.holders import Holder, HolderKind
from gpuwatch.models import Snapshot
from gpuwatch.placement.where import needs_of, where
from gpuwatch.request import Request
from tests.helpers.cli import run_cli
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.fleet.net import free_port
from tests.helpers.fleet.prometheus import StartPrometheus, Target
from tests.helpers.k8s_node import NODE, node_pods
from tests.helpers.kubelet import Kubelet, kubelet_stand_in
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a daemon, a kubelet stand-in, and a Prometheus

TRAINER = Holder(HolderKind.POD, "ml/train-0", container="trainer")
SERVER = Holder(HolderKind.POD, "serving/infer-7", container="server")
Read = Callable[[Request], FleetState]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    """The node's devices as the daemon sees them (the simulation is the same anywhere)."""
    path = tmp_path_factory.mktemp("node") / "node.toml"
    path.write_text(NODE)
    return SimBackend(path).sample()


@pytest.fixture
def kubelet(node: Snapshot) -> Iterator[Kubelet]:
    with kubelet_stand_in(*node_pods(node)) as stand_in:
        yield stand_in


@pytest.fixture
def daemon(tmp_path: Path, kubelet: Kubelet) -> Iterator[str]:
    """The daemon's `/metrics` address, once it knows the pods."""
    port = free_port()
    args = (
        *("--jobs", "kubernetes", "--pod-resources-socket", kubelet.socket_path),
        *("--jobs-refresh", "1s", "--listen", f"127.0.0.1:{port}"),
    )
    with running_daemon(tmp_path, *args, scenario=NODE) as (_, sock, _):
        wait_until(lambda: get_json(sock, "/v1/jobs")[1]["known"], "the pods to be known")
        yield f"127.0.0.1:{port}"


@pytest.fixture(params=["scraped", "prometheus"])
def read(request: pytest.FixtureRequest, daemon: str, start_prometheus: StartPrometheus) -> Read:
    """Reads the daemon's node as `where` does: its `/metrics` directly, or a Prometheus
    scraping it every second."""
    if request.param == "scraped":
        return lambda _: ScrapeSource([daemon], timeout_s=5.0).read()
    prometheus = start_prometheus([Target(daemon)])
    prometheus.wait_until_up([daemon])
    return lambda asked: PrometheusSource(prometheus.url, needs=needs_of(asked)).read()


def only_node(fleet: FleetState) -> NodeState:
    (node,) = fleet.nodes
    assert node.up, node.error
    return node


def test_the_fleet_reads_each_pod_on_the_devices_it_holds(read: Read, node: Snapshot) -> None:
    # WHEN the node is read GPU by GPU (MIG devices asked for)
    state = only_node(read(Request(mig="any")))
    # THEN the pods hold what the kubelet gave them, and nothing else is held or unknown
    gpus, migs = node.gpus, node.mig_devices
    holders = state.holders
    assert [holders.holders_of(gpu) for gpu in gpus[:3]] == [(), (TRAINER,), (TRAINER,)]
    assert [holders.holders_of(device) for device in migs] == [(), (SERVER,)]
    assert holders.known and not holders.unknown


def test_where_never_offers_a_gpu_or_mig_device_a_pod_holds(read: Read, node: Snapshot) -> None:
    # WHEN two whole GPUs, then one, then a MIG device are asked for (and two of any use,
    # which reads the node GPU by GPU, not by its daemon's verdicts)
    two, one, mig = Request(count=2), Request(), Request(mig="any")
    assert where(read(two), two).fits == ()
    refused = where(read(Request(count=2, allow_busy=True)), Request(count=2, allow_busy=True))
    # THEN two cannot be had (the pods named), one is GPU 0, the MIG device the free one
    assert refused.fits == ()
    reasons = refused.misses[0].reasons
    assert "GPU 1: held by pod ml/train-0 (container trainer)" in reasons
    assert [device.uuid for device in where(read(one), one).fits[0].devices] == [node.gpus[0].uuid]
    assert [device.uuid for device in where(read(mig), mig).fits[0].devices] == [
        node.mig_devices[0].uuid
    ]


def test_while_the_kubelet_hangs_no_device_is_offered_and_where_says_why(
    read: Read, kubelet: Kubelet
) -> None:
    # GIVEN the kubelet stops answering: the daemon's question passes its deadline
    kubelet.slow()
    try:
        asked = Request(allow_busy=True)  # read GPU by GPU, not by the daemon's verdicts
        wait_until(lambda: not only_node(read(asked)).holders.known, "the holders unknown")
        # WHEN where is asked for one GPU, of any use
        answer = where(read(asked), asked)
        # THEN none is offered, each for the reason the daemon cannot tell
        assert answer.fits == ()
        reasons = answer.misses[0].reasons
        assert all(
            f"GPU {i}: holders unknown: its daemon cannot tell" in reasons[i] for i in range(3)
        )
        # AND the daemon's own verdict agrees: at pick's defaults nothing fits either
        default = Request()
        assert where(read(default), default).fits == ()
        # AND told to take them anyway, where offers GPU 0
        anyway = Request(allow_busy=True, allow_unknown_holders=True)
        assert where(read(anyway), anyway).fits
    finally:
        kubelet.release()


def test_the_where_command_says_who_holds_each_gpu(daemon: str) -> None:
    # WHEN `gpuwatch where --node` asks for three GPUs of the node
    result = run_cli("where", "--node", daemon, "-n", "3", "-v")
    # THEN no node fits (exit 4), and the pod is named on its GPUs
    assert result.exit_code == 4, result.stderr
    assert "held by pod ml/train-0 (container trainer)" in result.stdout + result.stderr
