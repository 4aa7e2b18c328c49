"""`where`'s one round of queries against a real Prometheus: every query is one the server
accepts, and the fits are those of a whole read."""

from __future__ import annotations

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.placement.where import needs_of, where
from gpuwatch.request import Request
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.prometheus import Prometheus, StartDaemons, StartPrometheus, Target

pytestmark = pytest.mark.slow


def wait_for_where_series(prometheus: Prometheus, nodes: list[SimNode]) -> None:
    """Until Prometheus holds every series where reads of `nodes`: each GPU's free memory
    and the node's verdict on it, and a process on each GPU with memory in use."""
    gpus = sum(len(node.used_bytes) for node in nodes)
    prometheus.wait_for_count("gpuwatch_memory_free_bytes", gpus)
    prometheus.wait_for_count("gpuwatch_memory_available_bytes", gpus)
    used = sum(bool(used) for node in nodes for used in node.used_bytes)
    prometheus.wait_for_count("gpuwatch_process_memory_bytes", used)


def test_a_placed_read_through_prometheus_gives_the_fits_of_a_whole_read(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN three real daemons scraped by a real Prometheus: one idle, one half used, one full
    nodes = [
        SimNode("node-a", (0, 0)),
        SimNode("node-b", (0, 60 << 30)),
        SimNode("node-c", (70 << 30, 70 << 30)),
    ]
    daemons = start_daemons(nodes)
    prometheus = start_prometheus([Target(daemon.address) for daemon in daemons])
    prometheus.wait_until_up([daemon.address for daemon in daemons])
    wait_for_where_series(prometheus, nodes)
    request = Request(min_free_bytes=40 << 30, allow_busy=True)  # each GPU runs a process
    # WHEN where reads it for its request (GPU by GPU: not at pick's default limits), and
    # whole
    placed = PrometheusSource(prometheus.url, needs=needs_of(request)).read()
    whole = PrometheusSource(prometheus.url).read()
    # THEN the server accepts every query, and both find the same GPUs on the same nodes
    chosen = {fit.node: [d.uuid for d in fit.devices] for fit in where(placed, request).fits}
    assert sorted(chosen) == ["node-a", "node-b"]
    assert chosen == {fit.node: [d.uuid for d in fit.devices] for fit in where(whole, request).fits}


def test_each_nodes_verdict_through_prometheus_gives_the_fits_of_a_whole_read(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN three real daemons of idle GPUs scraped by a real Prometheus: one with nothing
    # running, one with a process on its second GPU, one with a process on each
    nodes = [
        SimNode("node-a", (0, 0), utilization_pct=0),
        SimNode("node-b", (0, 60 << 30), utilization_pct=0),
        SimNode("node-c", (2 << 30, 2 << 30), utilization_pct=0),
    ]
    daemons = start_daemons(nodes)
    prometheus = start_prometheus([Target(daemon.address) for daemon in daemons])
    prometheus.wait_until_up([daemon.address for daemon in daemons])
    wait_for_where_series(prometheus, nodes)
    for request, fitting in (
        (Request(min_free_bytes=40 << 30), ["node-a", "node-b"]),
        (Request(count=2), ["node-a"]),
    ):
        # WHEN where reads each node's verdict on its GPUs, and the fleet whole
        available = PrometheusSource(prometheus.url, needs=needs_of(request)).read()
        whole = PrometheusSource(prometheus.url).read()
        # THEN the server accepts every query, and both find the same GPUs on the nodes
        # whose GPUs no process holds
        assert all(node.offered is not None for node in available.nodes)
        chosen = {fit.node: [d.uuid for d in fit.devices] for fit in where(available, request).fits}
        assert sorted(chosen) == fitting
        assert chosen == {f.node: [d.uuid for d in f.devices] for f in where(whole, request).fits}
