"""The fleet table's refresh through Prometheus reads only what changed: `up` and every
exporter's families (gpuwatch daemons' figures, dcgm-exporter's and nvidia_gpu_exporter's
GPUs) of the targets scraped since the last refresh, the rest held; and what it shows is
what a source reading everything shows: nodes down and stale (by age, without new
samples), two targets claiming one name, MIG devices, pods as holders, recorded pages."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet.table_memory import SLOW_EVERY
from gpuwatch.fleet_model import FleetState
from tests.helpers.fleet.fakeprom import NOW, FakePrometheus, FakeTarget, with_node_figures
from tests.helpers.fleet.servers import fixture, serving

GPUWATCH = (
    fixture("gpuwatch_node.prom")
    .decode()
    .replace("1.7954727494912333e+09", repr(NOW - 6))  # its snapshot as current as its scrape
    .replace("gpu-node-07", "gpu-1")
)
DCGM = fixture("dcgm_node.prom").decode()
SMI = fixture("recorded/nvidia-gpu-exporter_h100_load.prom").decode()
DCGM_MIG_PODS = fixture("recorded/dcgm-exporter-4x_pr736_mixed-mig-pod_excerpt.prom").decode()
SMI_MIG = fixture("recorded/nvidia-gpu-exporter_h100-mig_load.prom").decode()
GIB = 1 << 30
NARROWED = "scrape_duration_seconds > "
"""What a query narrowed to the targets scraped since a time says (`promql.scraped_since`)."""


def fleet_targets() -> list[FakeTarget]:
    """A mixed fleet: a daemon exporting its figures, dcgm-exporters (one with MIG devices
    and pods, two claiming one name), nvidia_gpu_exporters (one MIG-enabled), a target
    whose scrapes fail."""
    daemon = FakeTarget("gpuwatch", "10.0.1.1:19400", GPUWATCH)
    twin = DCGM.replace("dgx-a100-03", "dgx-twin")
    return [
        with_node_figures(daemon),
        FakeTarget("dcgm", "10.0.0.1:9400", DCGM),
        FakeTarget("dcgm", "10.0.0.2:9400", DCGM_MIG_PODS),
        FakeTarget("dcgm", "10.0.0.3:9400", twin),
        FakeTarget("dcgm", "10.0.0.4:9400", twin),
        FakeTarget("smi", "10.0.2.1:9835", SMI),
        FakeTarget("smi", "10.0.2.2:9835", SMI_MIG),
        FakeTarget("dcgm", "10.0.0.9:9400", "", up=False, last_error="connection refused"),
    ]


def table_source(url: str, prometheus: FakePrometheus) -> PrometheusSource:
    """The table's source, its clock a second after Prometheus's evaluation time."""
    return PrometheusSource(url, clock=lambda: prometheus.now + 1, needs=Needs(per_node=True))


class Refreshed(NamedTuple):
    refresh: FleetState
    fresh: FleetState
    """A fresh source's read at the refresh's time."""
    queries: list[tuple[str, int]]
    """The refresh's queries, with the series each answered."""
    built: int
    """The nodes the refresh built from their series (not kept from the first read)."""


def refreshed(change: Callable[[FakePrometheus], None], *, later_s: float) -> Refreshed:
    """A table source's refresh after `change`, `later_s` after its first read."""
    prometheus = FakePrometheus(fleet_targets())
    with serving(prometheus) as url:
        source = table_source(url, prometheus)
        source.read()
        asked, built = len(prometheus.series_sent), source.nodes_built
        change(prometheus)
        prometheus.now = NOW + later_s
        refresh = source.read()
        queries = prometheus.series_sent[asked:]
        fresh = table_source(url, prometheus).read()
    return Refreshed(refresh, fresh, queries, source.nodes_built - built)


def scrape_again(instance: str, text: str) -> Callable[[FakePrometheus], None]:
    """Prometheus scrapes `instance` again, after the first read, finding `text`."""

    def change(prometheus: FakePrometheus) -> None:
        (index,) = [i for i, t in enumerate(prometheus.targets) if t.instance == instance]
        target = prometheus.targets[index]
        prometheus.targets[index] = dataclasses.replace(target, exposition=text, scraped_at=NOW + 1)

    return change


CHANGED = {
    "dcgm": ("10.0.0.1:9400", DCGM.replace("DCGM_FI_DEV_FB_FREE{", 'DCGM_FI_DEV_FB_FREE{x="",')),
    "dcgm-mig-pods": ("10.0.0.2:9400", DCGM),
    "smi": ("10.0.2.1:9835", SMI_MIG),
}


@pytest.mark.parametrize("scraped", CHANGED)
def test_a_refresh_asks_each_exporter_only_of_the_targets_scraped_since(scraped: str) -> None:
    # GIVEN the table's source, having read a mixed fleet
    # WHEN Prometheus scrapes one node again (of dcgm-exporter or nvidia_gpu_exporter),
    # finding other GPUs, and the table refreshes
    instance, text = CHANGED[scraped]
    refresh, fresh, queries, built = refreshed(scrape_again(instance, text), later_s=2)
    # THEN `up` and every exporter's families were asked of the targets scraped since
    # only, each answering that node's series alone
    exporters = [(q, n) for q, n in queries if "DCGM_FI_" in q or "nvidia_smi_" in q]
    ups = [(q, n) for q, n in queries if q.startswith("(timestamp(up)")]
    assert exporters and ups == [(ups[0][0], 1)]
    assert all(NARROWED in q for q, _ in [*exporters, *ups])
    assert sum(n for q, n in exporters if ("DCGM_FI_" in q) == scraped.startswith("dcgm")) > 0
    assert sum(n for q, n in exporters if ("DCGM_FI_" in q) != scraped.startswith("dcgm")) == 0
    # AND it built that node again only, and shows what a source reading everything
    # shows: the node as scraped again, the others as before, the target down with why,
    # the twins as two nodes
    assert built == 1
    assert refresh.nodes == fresh.nodes
    assert [n.claims for n in refresh.nodes if n.name == "dgx-twin"] == [2, 2]
    assert [n.error for n in refresh.nodes if not n.up] == [
        "Prometheus cannot scrape 10.0.0.9:9400 (job dcgm): connection refused"
    ]


def test_mig_devices_and_pods_held_between_refreshes_stay_as_read() -> None:
    # GIVEN the table's source, having read a mixed fleet
    # WHEN Prometheus scrapes only the daemon again and the table refreshes
    daemon = with_node_figures(FakeTarget("gpuwatch", "", GPUWATCH.replace(repr(NOW - 6), "0")))
    refresh, fresh, _, _ = refreshed(scrape_again("10.0.1.1:19400", daemon.exposition), later_s=2)
    # THEN the nodes not scraped since keep their MIG devices and the pods holding them,
    # and MIG devices an exporter does not tell stay unknown
    assert refresh.nodes == fresh.nodes
    (split,) = [n for n in refresh.nodes if n.target == "10.0.0.2:9400"]
    assert split.snapshot is not None and split.snapshot.mig_devices and split.pods
    (untold,) = [n for n in refresh.nodes if n.target == "10.0.2.2:9835"]
    assert untold.up and not untold.mig_devices_known


def test_a_node_not_scraped_since_is_the_very_same_node_its_data_older() -> None:
    # GIVEN the table's source, having read a mixed fleet
    prometheus = FakePrometheus(fleet_targets())
    with serving(prometheus) as url:
        source = table_source(url, prometheus)
        first = source.read()
        # WHEN it refreshes 30 s later, no target scraped since (within the 120 s limit)
        prometheus.now = NOW + 30
        second = source.read()
    # THEN each node up is the very node of the first read (the screen keeps its row; a
    # node whose name another target claims too is marked so again at each read), its
    # data 30 s older at the second read's time
    pairs = zip(first.nodes, second.nodes, strict=True)
    up = [(a, b) for a, b in pairs if a.up and a.claims == 1]
    assert up and all(a is b for a, b in up)
    for node, _ in up:
        grown = node.age_at(second.taken_at) - node.age_at(first.taken_at)  # type: ignore[operator]
        assert grown == pytest.approx(30)


def test_a_node_not_scraped_for_long_turns_stale_without_new_samples() -> None:
    # GIVEN the table's source, having read a mixed fleet, every node up but one
    # WHEN no target is scraped for 200 s (beyond the 120 s limit) and the table refreshes
    refresh, fresh, queries, built = refreshed(lambda prometheus: None, later_s=200)
    # THEN no exporter's series came again and no node was built again, yet every node
    # is stale by its age, as a source reading everything says
    assert all(n == 0 for q, n in queries if "DCGM_FI_" in q or "nvidia_smi_" in q)
    assert built == 0
    assert refresh.nodes == fresh.nodes
    ages = {n.target: n.age_at(refresh.taken_at) for n in refresh.nodes}
    assert ages["10.0.0.1:9400"] == pytest.approx(205)
    stale = [n for n in refresh.nodes if n.error and n.error.startswith("stale")]
    assert len(stale) == len(refresh.nodes) - 1 and not any(n.up for n in refresh.nodes)


def test_a_node_whose_scrape_fails_since_is_down_not_its_held_gpus() -> None:
    # GIVEN the table's source, having read a mixed fleet
    # WHEN Prometheus's next scrape of a dcgm-exporter fails, and the table refreshes
    def fails(prometheus: FakePrometheus) -> None:
        target = prometheus.targets[1]
        prometheus.targets[1] = dataclasses.replace(target, up=False, scraped_at=NOW + 1)

    refresh, fresh, _, _ = refreshed(fails, later_s=2)
    # THEN it is down under its last name, without its GPUs, as a fresh read says
    assert refresh.nodes == fresh.nodes
    (node,) = [n for n in refresh.nodes if n.target == "10.0.0.1:9400"]
    assert (node.name, node.up, node.snapshot) == ("dgx-a100-03", False, None)


def test_a_new_target_whose_instance_another_job_scrapes_marks_both_as_a_fresh_read() -> None:
    # GIVEN the table's source, having read a mixed fleet
    # WHEN a second job starts scraping an instance the fleet has (a dcgm-exporter), and
    # the table refreshes
    def second_job(prometheus: FakePrometheus) -> None:
        prometheus.targets.append(FakeTarget("dcgm-2", "10.0.0.1:9400", DCGM, scraped_at=NOW + 1))

    refresh, fresh, _, _ = refreshed(second_job, later_s=2)
    # THEN both targets are nodes told apart by their jobs, the one not scraped since too,
    # as a source reading everything says
    assert refresh.nodes == fresh.nodes
    shown = sorted(n.target for n in refresh.nodes if n.target.endswith("10.0.0.1:9400"))
    assert shown == ["dcgm-2/10.0.0.1:9400", "dcgm/10.0.0.1:9400"]


def test_users_read_again_change_the_nodes_whose_users_changed_alone() -> None:
    # GIVEN the table's source, having read two daemons, alice's and bob's processes on
    # each, and a Prometheus that evaluates each user's GPUs and memory
    targets = [
        with_node_figures(
            FakeTarget("gpuwatch", f"10.0.1.{n}:19400", GPUWATCH.replace("gpu-1", f"gpu-{n}"))
        )
        for n in (1, 2)
    ]
    prometheus = FakePrometheus(targets, users_evaluated=True)
    with serving(prometheus) as url:
        source = table_source(url, prometheus)
        first = {node.name: node for node in source.read().nodes}
        # WHEN gpu-1's process of alice is carol's at its next scrape, and the table
        # refreshes until each part of what changes slowly was read again
        carols = targets[0].exposition.replace('user="alice"', 'user="carol"')
        prometheus.targets[0] = dataclasses.replace(
            targets[0], exposition=carols, scraped_at=NOW + 1
        )
        prometheus.now = NOW + 2
        reads = [{node.name: node for node in source.read().nodes} for _ in range(SLOW_EVERY)]
        fresh = table_source(url, prometheus).read()
    # THEN gpu-1's users are as they were until its users are read again, then carol is
    # one, as a source reading everything says; gpu-2 stays the very node of the first read
    users = [read["gpu-1"].figures.users for read in reads]  # type: ignore[union-attr]
    before = (("alice", 1, 30 * GIB), ("bob", 1, 12 * GIB))
    assert users[0] == first["gpu-1"].figures.users == before  # type: ignore[union-attr]
    assert users[-1] == (("bob", 1, 12 * GIB), ("carol", 1, 30 * GIB))
    assert list(fresh.nodes) == [reads[-1]["gpu-1"], reads[-1]["gpu-2"]]
    assert [read["gpu-2"] is first["gpu-2"] for read in reads] == [True] * SLOW_EVERY
