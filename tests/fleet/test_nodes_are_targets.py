"""A node is a scrape target, whatever name it gives: real daemons given one --node-name,
and a node naming itself after another, are as many nodes, each told apart by its target,
in `where`, `fleet --once` and `fleet --json`, scraped directly and through Prometheus."""

from __future__ import annotations

import json
import re
import time

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from tests.helpers.cli import run_cli
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.prometheus import StartDaemons, StartPrometheus, Target
from tests.helpers.fleet.servers import Reply, fixture, serving

pytestmark = pytest.mark.slow

GIB = 1 << 30


def first_words(stdout: str) -> list[str]:
    return [line.split(" ")[0] for line in stdout.splitlines()]


def test_two_daemons_given_one_node_name_are_two_nodes(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN two daemons of idle GPUs, both given --node-name gpu-07 (a cloned image)
    nodes = [SimNode("gpu-07", (0, 0), seed=seed, utilization_pct=0) for seed in (1, 2)]
    daemons = start_daemons(nodes)
    addresses = sorted(d.address for d in daemons)
    options = [item for address in addresses for item in ("--node", address)]
    # WHEN where, fleet --once and fleet --json read them directly
    placed = run_cli("where", *options)
    once = run_cli("fleet", "--once", *options)
    document = json.loads(run_cli("fleet", "--json", *options).stdout)
    # THEN each is a node, named by its target where a script takes the first word
    assert placed.exit_code == 0, placed.stderr
    assert sorted(first_words(placed.stdout)) == [f"gpu-07@{a}" for a in addresses]
    assert once.stdout.startswith("2 nodes: 2 up")
    nodes_told = [(n["node"], n["claims"], n["label"]) for n in document["nodes"]]
    assert nodes_told == [("gpu-07", 2, f"gpu-07@{a}") for a in addresses]
    # AND through Prometheus alike
    prometheus = start_prometheus([Target(address) for address in addresses])
    prometheus.wait_until_up(addresses)
    fleet = PrometheusSource(prometheus.url).read()
    assert [(n.label, n.up) for n in fleet.nodes] == [(f"gpu-07@{a}", True) for a in addresses]


def hostile_page(name: str) -> bytes:
    """A daemon's page (tests/fleet/data/gpuwatch_node.prom) naming itself `name`, its
    snapshot taken now."""
    text = fixture("gpuwatch_node.prom").decode().replace("gpu-node-07", name)
    stamp = r"^(gpuwatch_sample_timestamp_seconds\{.*\}) \S+$"
    return re.sub(stamp, rf"\1 {time.time()!r}", text, flags=re.MULTILINE).encode()


def test_a_node_naming_itself_after_another_hides_nothing(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN a real node gpu-01 with two idle GPUs, and a hostile one that says it is gpu-01
    (daemon,) = start_daemons([SimNode("gpu-01", (0, 0), utilization_pct=0)])

    def route(path: str, headers: dict[str, str]) -> Reply:
        return Reply(hostile_page("gpu-01"))

    with serving(route) as url:
        impostor = url.removeprefix("http://")
        targets = sorted([daemon.address, impostor])
        options = [item for address in targets for item in ("--node", address)]
        # WHEN where and the table read both directly, and through Prometheus
        placed = run_cli("where", "--allow-busy", *options)
        once = run_cli("fleet", "--once", *options)
        prometheus = start_prometheus([Target(address) for address in targets])
        prometheus.wait_until_up(targets)
        fleet = PrometheusSource(prometheus.url).read()
    # THEN the real node is never hidden: both are nodes, each named by its target; where
    # and the table count the same two
    labels = [f"gpu-01@{address}" for address in targets]
    assert placed.exit_code == 0, placed.stderr
    assert daemon.address in " ".join(first_words(placed.stdout))
    assert set(first_words(placed.stdout)) <= set(labels)
    assert once.stdout.startswith("2 nodes: 2 up")
    assert [n.label for n in fleet.nodes] == labels
