"""While Prometheus warms up, the fleet screen shows what is known and says what is not, never
a wrong total: nodes whose users the rules have not evaluated yet, and idle holders over a
window of data Prometheus does not hold yet. Real daemons behind a real Prometheus, with
the example rules recorded, or evaluated by the source where none are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.tui.fleet.cells import users_text
from gpuwatch.tui.fleet.model import NodeFilter
from gpuwatch.tui.fleet.rows import build_rows, totals, user_rows
from tests.helpers.fleet.daemons import GIB, RunningDaemon, SimNode
from tests.helpers.fleet.prometheus import StartDaemons, StartPrometheus, Target
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow

RULES = Path(__file__).resolve().parents[2] / "examples" / "gpuwatch-fleet-rules.yml"
NODES = [
    SimNode("node-a", (60 * GIB, 60 * GIB)),
    SimNode("node-b", (60 * GIB, 60 * GIB, 0)),
    SimNode("node-c", (60 * GIB, 0), utilization_pct=0),  # held, and idle since it started
    SimNode("node-d", (0, 60 * GIB)),
    SimNode("node-e", (0, 0)),  # alice runs nothing here
]
FIRST = 2
"""Nodes scraped before the source's first read; the others come after."""


def alice_on(daemon: RunningDaemon) -> tuple[int, int]:
    """Alice's GPUs and memory on a node, as the simulated node runs them."""
    used = [size for size in daemon.node.used_bytes if size]
    return len(used), sum(used)


class Checked:
    """Each read's fleet held to the truth of the daemons it reads."""

    def __init__(self, daemons: list[RunningDaemon]) -> None:
        self.truth = {daemon.address: alice_on(daemon) for daemon in daemons}
        self.warming_seen: list[str] = []

    def check(self, fleet: FleetState) -> None:
        up = [n for n in fleet.nodes if n.up and n.summary is not None]
        known = [n for n in up if n.summary is not None and n.summary.users is not None]
        unknown = {n.target for n in up} - {n.target for n in known}
        rows = build_rows(fleet)
        seen = user_rows(fleet)
        # THEN the users view counts the nodes whose users are known, and those alone
        wanted = [self.truth[n.target] for n in known if self.truth[n.target][0]]
        alice = [(r.nodes, r.gpus, r.memory_bytes) for r in seen.rows if r.user == "alice"]
        expected = [(len(wanted), sum(g for g, _ in wanted), sum(m for _, m in wanted))]
        assert alice == (expected if wanted else []), fleet
        assert seen.unknown == len(unknown)
        # AND the filter never hides a node alice uses; it keeps one she does not only
        # while its users are not known
        by_target = {n.label: n.target for n in fleet.nodes}
        kept = {
            by_target[r.node] for r in rows if r.up and NodeFilter.parse("user:alice").matches(r)
        }
        hers = {n.target for n in up if self.truth[n.target][0]}
        assert hers <= kept and kept - hers <= unknown
        # AND no node has been watched for 10 minutes: none has an idle holder yet, each is
        # warming up, and the line above the table says so
        assert all(r.idle_held is None and r.warming for r in rows if r.up)
        assert totals(rows).warming == len(up)
        if unknown:
            self.warming_seen.append("".join(text for text, _ in users_text(fleet, 100)))

    def read_until_users_known(self, source: PrometheusSource) -> None:
        """Reads at a refresh's pace, each read checked, until every node's users are known."""

        def known() -> bool:
            fleet = source.read()
            self.check(fleet)
            return self.users_known(fleet)

        wait_until(known, "every node's users", timeout_s=120, interval_s=0.2)

    def users_known(self, fleet: FleetState) -> bool:
        nodes: list[NodeState] = [n for n in fleet.nodes if n.up and n.summary is not None]
        return len(nodes) == len(self.truth) and all(
            n.summary is not None and n.summary.users is not None for n in nodes
        )


@pytest.mark.parametrize("recorded", [True, False], ids=["rules-recorded", "rules-evaluated"])
def test_the_fleet_table_never_shows_a_wrong_total_while_prometheus_warms_up(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus, recorded: bool
) -> None:
    # GIVEN five gpuwatch daemons, two of them scraped by a Prometheus that records the
    # example rules every 10 s (or records none), and the table's source reading it
    daemons = start_daemons(NODES)
    targets = [Target(d.address) for d in daemons]
    prometheus = start_prometheus(
        targets[:FIRST], rule_files=[RULES] if recorded else [], evaluation_interval_s=10.0
    )
    prometheus.wait_until_up([d.address for d in daemons[:FIRST]])
    if recorded:
        prometheus.wait_for_count("gpuwatch:node_gpu_models:count", FIRST)
    source = PrometheusSource(prometheus.url, needs=Needs(per_node=True))
    checked = Checked(daemons[:FIRST])
    checked.read_until_users_known(source)
    # WHEN the other three are scraped from now on, and the source reads on
    prometheus.set_targets(targets)
    checked = Checked(daemons)
    checked.read_until_users_known(source)
    # THEN while the new nodes' users were not known, the users view said so
    assert checked.warming_seen
    assert "warming up: their users are not counted yet" in checked.warming_seen[0] or (
        "warming up: its users are not counted yet" in checked.warming_seen[0]
    )
    # AND the installed `gpuwatch fleet --once` says every node is warming up, IDLE unknown
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    once = subprocess.run(
        [gpuwatch, "fleet", "--once", "--prometheus", prometheus.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert once.returncode == 0, once.stderr
    head, titles, *lines = once.stdout.splitlines()
    assert f"{len(NODES)} up" in head and f"{len(NODES)} warming up" in head
    idle = titles.index("IDLE")  # the cells are under their title, right-justified
    assert {line[idle : idle + len("IDLE")].strip() for line in lines} == {"?"}
