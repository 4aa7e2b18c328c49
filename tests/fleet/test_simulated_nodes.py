"""A simulated node is one in the fleet only as what it is: a daemon serving one exports
`gpuwatch_simulated 1`, and the fleet's table names it `(simulated)` and its JSON says
`"simulated": true`, read directly or through Prometheus."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.endpoints import DCGM_HOSTNAME, Endpoint
from tests.helpers.fleet.prometheus import StartDaemons, StartPrometheus, Target


def test_a_node_whose_exporter_says_nothing_of_it_is_not_simulated(
    dcgm_endpoint: Endpoint,
) -> None:
    table = run_cli("fleet", "--once", "--node", dcgm_endpoint.address)
    document = json.loads(run_cli("fleet", "--json", "--node", dcgm_endpoint.address).stdout)
    assert DCGM_HOSTNAME in table.stdout and "simulated" not in table.stdout
    assert [node["simulated"] for node in document["nodes"]] == [False]


@pytest.mark.slow  # a real daemon, and a real Prometheus
def test_a_simulated_daemon_is_called_simulated_scraped_or_through_prometheus(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN a daemon serving a simulated node, as one more node of a fleet (--node-name)
    (daemon,) = start_daemons([SimNode("gpu-01")])
    prometheus = start_prometheus([Target(daemon.address)])
    prometheus.wait_until_up([daemon.address])
    prometheus.wait_for_count("gpuwatch_simulated", 1)
    for source in (["--node", daemon.address], ["--prometheus", prometheus.url]):
        # WHEN the fleet's table and JSON read it
        table = run_cli("fleet", "--once", *source)
        document = json.loads(run_cli("fleet", "--json", *source).stdout)
        # THEN both say it is simulated
        assert table.exit_code == 0, table.stderr
        assert "gpu-01 (simulated)" in table.stdout, table.stdout
        assert [node["simulated"] for node in document["nodes"]] == [True], source
