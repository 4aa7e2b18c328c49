"""The fleet table's refresh through a real Prometheus scraping recorded dcgm-exporter and
nvidia_gpu_exporter pages: `up` and every exporter's families are asked of the targets
scraped since the last refresh, Prometheus answers only their series, and the refresh
shows what a whole read shows (MIG devices, pods as holders, a target never up)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState
from tests.helpers.fleet.endpoints import Endpoint, refusing, serving_recorded
from tests.helpers.fleet.prometheus import Prometheus, StartPrometheus, Target

pytestmark = pytest.mark.slow
PAGES = {
    "dcgm-exporter-4x_pr736_mixed-mig-pod_excerpt.prom": "dcgm",
    "dcgm-exporter_kops_l4.prom": "dcgm",
    "nvidia-gpu-exporter_h100-mig_load.prom": "smi",
    "nvidia-gpu-exporter_l40s_load.prom": "smi",
}
NARROWED = "scrape_duration_seconds > "
"""What a query narrowed to the targets scraped since a time says (`promql.scraped_since`)."""


@contextmanager
def recorded_fleet(start: StartPrometheus) -> Iterator[tuple[Prometheus, list[Endpoint], str]]:
    """The pages served and a target never up, scraped every 5 s, each scraped once."""
    with ExitStack() as stack:
        pages = {name: stack.enter_context(serving_recorded(name)) for name in PAGES}
        never = stack.enter_context(refusing())
        targets = [Target(endpoint.address, PAGES[name]) for name, endpoint in pages.items()]
        prometheus = start([*targets, Target(never.address, "dcgm")], scrape_interval_s=5.0)
        prometheus.wait_until_up([endpoint.address for endpoint in pages.values()])
        prometheus.wait_until_up([never.address], up=False)
        yield prometheus, list(pages.values()), never.address


def recording(source: PrometheusSource, answered: list[tuple[str, set[str]]]) -> None:
    """Files each query `source` sends, with the instances its answer holds series of."""
    samples = source.client.samples

    def record(queries: Sequence[str], names: Sequence[str], **options: Any) -> Any:
        answers: list[tuple[float, list[Sample]]] = samples(queries, names, **options)
        for query, (_, vector) in zip(queries, answers, strict=True):
            answered.append((query, {s.labels.get("instance", "") for s in vector}))
        return answers

    source.client.samples = record  # type: ignore[method-assign]


def told(node: NodeState) -> tuple[object, ...]:
    """What a node says of itself, whenever it is read (not its age)."""
    snapshot = node.snapshot
    gpus = None if snapshot is None else (snapshot.gpus, snapshot.mig_devices)
    return (node.target, node.name, node.up, node.error, gpus, node.holders, node.pods)


def fleet_told(fleet: FleetState) -> list[tuple[object, ...]]:
    return [told(node) for node in fleet.nodes]


def test_a_refresh_asks_only_of_the_targets_a_real_prometheus_scraped_since(
    start_prometheus: StartPrometheus,
) -> None:
    with recorded_fleet(start_prometheus) as (prometheus, pages, never):
        # GIVEN the table's source, having read recorded dcgm-exporter and
        # nvidia_gpu_exporter pages and a target never up through a real Prometheus
        source = PrometheusSource(prometheus.url, needs=Needs(per_node=True))
        answered: list[tuple[str, set[str]]] = []
        recording(source, answered)
        first = source.read()
        asked = len(answered)
        # WHEN it refreshes
        refresh = source.read()
        since = first.taken_at - 0.25
        scraped = prometheus.query(f"timestamp(up) + scrape_duration_seconds > {since:.3f}")
        fresh = PrometheusSource(prometheus.url, needs=Needs(per_node=True)).read()
    # THEN `up` and each exporter's families were asked of the targets scraped since,
    # and Prometheus answered no series of a target it had not scraped since
    refreshed = answered[asked:]
    exporters = [(q, i) for q, i in refreshed if "DCGM_FI_" in q or "nvidia_smi_" in q]
    ups = [(q, i) for q, i in refreshed if q.startswith("(timestamp(up)")]
    assert {("DCGM_FI_" in q) for q, _ in exporters} == {True, False} and len(ups) == 1
    assert all(NARROWED in q for q, _ in [*exporters, *ups])
    since_then = {sample.labels["instance"] for sample in scraped}
    assert all(instances <= since_then for _, instances in [*exporters, *ups])
    # AND it shows the fleet as a whole read does: each page's GPUs, MIG devices and
    # pods, the target never up down
    assert fleet_told(refresh) == fleet_told(fresh)
    assert sum(node.up for node in refresh.nodes) == len(pages)
    assert [node.target for node in refresh.nodes if not node.up] == [never]
    assert any(n.snapshot is not None and n.snapshot.mig_devices for n in refresh.nodes)
    assert any(node.pods for node in refresh.nodes)
