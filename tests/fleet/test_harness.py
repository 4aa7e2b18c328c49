"""The fleet's test harness itself: a real Prometheus scraping real daemons, the dcgm
stand-in and nodes that hang or refuse, as the fleet's tests will rely on."""

from __future__ import annotations

import re
import socket

import pytest

from tests.helpers.fleet.daemons import GIB, SimNode
from tests.helpers.fleet.endpoints import DCGM_FREE_MIB, DCGM_HOSTNAME, Endpoint
from tests.helpers.fleet.net import fetch
from tests.helpers.fleet.prometheus import (
    Sample,
    StartDaemons,
    StartPrometheus,
    StartSimFleet,
    Target,
)
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real Prometheus and real daemons

NODES = (
    SimNode("node-a", (0, 40 * GIB)),
    SimNode("node-b", (70 * GIB, 10 * GIB, 0)),
    SimNode("node-c", (5 * GIB,), model="A100-40GB"),
)


def free_by_node(samples: list[Sample]) -> dict[str, dict[int, float]]:
    nodes: dict[str, dict[int, float]] = {}
    for sample in samples:
        host = sample.labels.get("hostname") or sample.labels["Hostname"]
        nodes.setdefault(host, {})[int(sample.labels["gpu"])] = sample.value
    return nodes


def test_prometheus_scrapes_each_daemon_as_its_own_node(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus, dcgm_endpoint: Endpoint
) -> None:
    # GIVEN three daemons, each its own simulated node, and a dcgm-exporter
    daemons = start_daemons(NODES)
    addresses = [daemon.address for daemon in daemons]
    prometheus = start_prometheus(
        [*(Target(address) for address in addresses), Target(dcgm_endpoint.address, job="dcgm")]
    )
    # WHEN Prometheus has scraped them all
    prometheus.wait_until_up([*addresses, dcgm_endpoint.address])
    # THEN free memory by hostname is each node's own, GPU by GPU
    expected = {node.name: dict(enumerate(node.free_bytes())) for node in NODES}
    assert free_by_node(prometheus.query("gpuwatch_memory_free_bytes")) == expected
    # AND dcgm-exporter's node is there under its Hostname, in MiB
    dcgm = free_by_node(prometheus.query("DCGM_FI_DEV_FB_FREE"))
    assert dcgm == {DCGM_HOSTNAME: dict(enumerate(map(float, DCGM_FREE_MIB)))}


def test_a_daemon_killed_mid_run_is_down_while_the_others_stay_up(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN three daemons scraped by Prometheus
    daemons = start_daemons(NODES)
    prometheus = start_prometheus([Target(daemon.address) for daemon in daemons])
    prometheus.wait_until_up([daemon.address for daemon in daemons])
    # WHEN one is killed
    daemons[1].kill()
    # THEN its `up` turns 0 and the others' stay 1
    prometheus.wait_until_up([daemons[1].address], up=False)
    prometheus.wait_until_up([daemons[0].address, daemons[2].address])


def test_nodes_that_hang_refuse_or_serve_elsewhere_are_down(
    start_prometheus: StartPrometheus,
    hanging_endpoint: Endpoint,
    refusing_endpoint: Endpoint,
    dcgm_endpoint: Endpoint,
) -> None:
    # GIVEN Prometheus, told after its start (a reload) to scrape a node that hangs, one
    # that refuses, and an exporter at a path where it serves nothing
    prometheus = start_prometheus()
    stuck = [hanging_endpoint.address, refusing_endpoint.address, dcgm_endpoint.address]
    prometheus.set_targets(
        [
            Target(hanging_endpoint.address),
            Target(refusing_endpoint.address),
            Target(dcgm_endpoint.address, metrics_path="/elsewhere"),
        ]
    )
    # THEN all three are down, each after its scrape ended (the hang at the scrape timeout)
    prometheus.wait_until_up(stuck, up=False)


def test_a_hanging_node_accepts_and_never_answers(hanging_endpoint: Endpoint) -> None:
    # GIVEN a node that hangs WHEN a client connects and asks for /metrics
    with socket.create_connection((hanging_endpoint.host, hanging_endpoint.port), 10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        client.settimeout(0.5)
        # THEN no answer comes
        with pytest.raises(TimeoutError):
            client.recv(1)


def test_a_refusing_node_refuses(refusing_endpoint: Endpoint) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((refusing_endpoint.host, refusing_endpoint.port), 10).close()


def test_a_sim_fleet_serves_distinct_nodes_whose_readings_move(
    start_sim_fleet: StartSimFleet,
) -> None:
    # GIVEN one process serving 5 nodes of 4 GPUs, one hanging and one refusing address
    fleet = start_sim_fleet(5, gpus=4, hang=1, refuse=1)
    assert sorted(fleet.nodes) == [f"node-000{number}" for number in range(1, 6)]
    # WHEN each node's /metrics is read
    texts = {
        name: fetch(f"http://{address}/metrics", timeout_s=10)
        for name, address in fleet.nodes.items()
    }
    # THEN each names itself, with 4 GPUs
    for name, text in texts.items():
        hosts = set(re.findall(rb'gpuwatch_memory_free_bytes\{gpu="\d",hostname="([^"]+)"', text))
        assert hosts == {name.encode()}
        assert text.count(b"gpuwatch_gpu_up{") == 4
    # AND its sample timestamp moves with the clock
    first = fleet.nodes["node-0001"]
    before = sample_timestamp(texts["node-0001"])
    wait_until(
        lambda: sample_timestamp(fetch(f"http://{first}/metrics", timeout_s=10)) != before,
        "the sample timestamp to move",
        interval_s=0.1,
    )
    # AND its stand-ins for broken nodes fail as named
    for address in (*fleet.hanging, *fleet.refusing):
        assert fetch(f"http://{address}/metrics", timeout_s=0.5) == b""


def sample_timestamp(text: bytes) -> float:
    found = re.search(rb"gpuwatch_sample_timestamp_seconds\{[^}]*\} (\S+)", text)
    assert found, text[:500]
    return float(found.group(1))
