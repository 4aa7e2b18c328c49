"""A refresh's narrowed queries against a real Prometheus: the targets scraped since are
named in each selector, a long query goes as a POSTed form, and the fleet read so is
the fleet a whole read finds."""

from __future__ import annotations

import pytest

from gpuwatch.fleet import promapi
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet_model import FleetState
from tests.helpers.fleet.prometheus import StartPrometheus, StartSimFleet, Target
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow


def shape(fleet: FleetState) -> dict[str, tuple[bool, list[str | None]]]:
    """Each node's state and its GPUs' UUIDs: what two reads a moment apart share."""
    return {
        node.name: (node.up, [gpu.uuid for gpu in node.snapshot.gpus] if node.snapshot else [])
        for node in fleet.nodes
    }


def test_a_narrowed_refresh_posted_to_prometheus_finds_the_fleet_of_a_whole_read(
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
    source = PrometheusSource(prometheus.url)
    asked: list[str] = []
    samples = source.client.samples
    monkeypatch.setattr(
        source.client,
        "samples",
        lambda texts, names, **options: asked.extend(texts) or samples(texts, names, **options),
    )
    source.read()

    def narrowed_refresh() -> FleetState | None:
        asked.clear()
        fleet = source.read()
        return fleet if any("instance=~" in text for text in asked) else None

    # WHEN it refreshes after some of the nodes, not all, were scraped again (each second)
    refreshed = wait_until(
        narrowed_refresh, "a refresh between two nodes' scrapes", timeout_s=60, interval_s=0.1
    )
    whole = PrometheusSource(prometheus.url).read()
    # THEN the server took every narrowed query, and the nodes are those of a whole read
    assert shape(refreshed) == shape(whole)
    assert len(refreshed.nodes) == 6 and all(node.up for node in refreshed.nodes)
