"""The line of waiting jobs and the Slurm job on each GPU, through a real Prometheus scraping
simulated gpuwatch nodes that tell them: the same as each node's own `/metrics` says, for
the same fixed number of queries."""

from __future__ import annotations

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from gpuwatch.fleet_model import FleetState
from tests.helpers.fleet.prometheus import StartPrometheus, StartSimFleet, Target
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real Prometheus and a process of simulated nodes


def work(fleet: FleetState) -> dict[str, object]:
    return {node.name: (node.lease_waiters, node.longest_wait_s, node.jobs) for node in fleet.nodes}


def test_prometheus_carries_each_nodes_line_and_jobs_as_the_node_tells_them(
    start_sim_fleet: StartSimFleet, start_prometheus: StartPrometheus
) -> None:
    # GIVEN five simulated nodes telling their line and jobs, scraped by a real Prometheus
    sim = start_sim_fleet(5, gpus=4, jobs=True)
    addresses = list(sim.nodes.values())
    prometheus = start_prometheus([Target(address) for address in addresses])
    prometheus.wait_until_up(addresses)
    source = PrometheusSource(prometheus.url)

    # WHEN the fleet is read through Prometheus, and each node directly
    def read_with_jobs() -> FleetState | None:
        fleet = source.read()
        return fleet if len(fleet.nodes) == 5 and all(n.jobs for n in fleet.nodes) else None

    through = wait_until(read_with_jobs, "every node's jobs through Prometheus")
    direct = ScrapeSource(addresses).read()
    # THEN both tell each node's line and jobs alike
    assert work(through) == work(direct)
    assert len(through.nodes) == 5
    # AND the fleet has jobs waiting, and a job that leaves its GPU idle
    assert any(node.lease_waiters for node in through.nodes)
    assert any(job.allocated_idle_s for node in through.nodes for job in node.jobs or ())
