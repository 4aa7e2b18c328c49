"""Queries against a real Prometheus as a refresh sends them: each POSTed as a form where
long, a node in focus named in its selectors, and the fleet read so the fleet a whole read
finds."""

from __future__ import annotations

import pytest

from gpuwatch.fleet import promapi
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState
from tests.helpers.fleet.prometheus import StartPrometheus, StartSimFleet, Target

pytestmark = pytest.mark.slow


def shape(fleet: FleetState) -> dict[str, tuple[bool, list[str | None]]]:
    """Each node's state and its GPUs' UUIDs: what two reads a moment apart share."""
    return {
        node.name: (node.up, [gpu.uuid for gpu in node.snapshot.gpus] if node.snapshot else [])
        for node in fleet.nodes
    }


def test_a_posted_refresh_with_a_node_in_focus_finds_the_fleet_of_a_whole_read(
    start_sim_fleet: StartSimFleet,
    start_prometheus: StartPrometheus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a real Prometheus scraping 6 simulated nodes, and every query long enough to
    # be POSTed (as one naming hundreds of targets is)
    fleet = start_sim_fleet(6, gpus=2)
    prometheus = start_prometheus([Target(address) for address in fleet.nodes.values()])
    prometheus.wait_until_up(list(fleet.nodes.values()))
    monkeypatch.setattr(promapi, "MAX_GET_URL_CHARS", 1)
    source = PrometheusSource(prometheus.url, needs=Needs(per_node=True))
    source.read()
    # WHEN the table's source reads it with one node's detail open
    focused = sorted(fleet.nodes)[2]
    source.focus([focused])
    refreshed = source.read()
    whole = PrometheusSource(prometheus.url).read()
    # THEN the server took every query, the node in focus came GPU by GPU, the others as
    # their figures, and the nodes are those of a whole read
    assert [n.name for n in refreshed.nodes if n.snapshot is not None] == [focused]
    assert all(n.summary is not None for n in refreshed.nodes)
    assert shape(refreshed)[focused] == shape(whole)[focused]
    assert [(n.name, n.up) for n in refreshed.nodes] == [(n.name, n.up) for n in whole.nodes]
    assert len(refreshed.nodes) == 6 and all(node.up for node in refreshed.nodes)
