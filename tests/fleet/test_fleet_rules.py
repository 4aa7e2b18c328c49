"""The example recording rules (`examples/gpuwatch-fleet-rules.yml`): they compute what
the fleet table shows, and a fleet read from them, or from their expressions where the
server records none, shows the same table as one read GPU by GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from msgspec.structs import astuple, replace

from gpuwatch import node_figures
from gpuwatch.fleet import summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState, NodeSummary
from gpuwatch.models import GpuSample, MigDevice
from gpuwatch.tui.fleet.rows import NodeRow, build_rows, user_rows
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.prometheus import StartDaemons, StartPrometheus, Target

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "gpuwatch-fleet-rules.yml"
RULES_TEST = Path(__file__).parent / "data" / "gpuwatch-fleet-rules.test.yml"
GIB = 1 << 30


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


@pytest.mark.parametrize(
    "argv",
    [["check", "rules", str(RULES)], ["test", "rules", str(RULES_TEST)]],
    ids=["check", "unit-tests"],
)
def test_promtool_accepts_the_rules_and_their_unit_tests_pass(argv: list[str]) -> None:
    # GIVEN the example rules, and a node of a busy, a leased, a lost and an idle GPU
    # WHEN promtool checks them and runs their tests
    done = subprocess.run([promtool(), *argv], capture_output=True, text=True, check=False)
    # THEN every rule is valid and computes what the fleet table shows
    assert done.returncode == 0, done.stdout + done.stderr


MOVING = ("utilization_pct", "hottest_c", "power_w")
"""Figures the simulated GPUs move from second to second: the rules' evaluation and a read
GPU by GPU may see different seconds."""


def shown(row: NodeRow) -> tuple[object, ...]:
    """A row as the table shows it, less the moving figures, idle holders (the screen times
    those itself, the rules over 10 minutes: warming up until Prometheus holds them) and
    age."""
    return astuple(replace(row, **dict.fromkeys((*MOVING, "idle_held", "data_at", "warming"))))


def moving(row: NodeRow) -> list[float | None]:
    return [getattr(row, name) for name in MOVING]


def test_the_figures_evaluated_where_none_are_recorded_are_the_example_rules() -> None:
    # GIVEN the example rules file, and the expressions a source evaluates without it
    with RULES.open() as file:
        (group,) = yaml.safe_load(file)["groups"]
    # WHEN each recorded name's expression is compared, spaces aside
    in_file = {rule["record"]: " ".join(rule["expr"].split()) for rule in group["rules"]}
    in_code = {
        name: " ".join(expr.replace("$m", "").replace("$w", "10m").split())
        for name, expr in summaries.RULES.items()
    }
    # THEN they are the same figures by the same expressions
    assert in_file == in_code


@pytest.mark.slow
def test_the_fleet_table_from_per_node_figures_is_the_table_from_every_gpu(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN three gpuwatch daemons, a Prometheus recording the example rules, and one
    # that records none
    nodes = [
        SimNode("node-a", (0, 0)),
        SimNode("node-b", (40 * GIB, 0, 70 * GIB)),
        SimNode("node-c", (79 * GIB,)),
    ]
    daemons = start_daemons(nodes)
    targets = [Target(d.address) for d in daemons]
    prometheus = start_prometheus(targets, rule_files=[RULES])
    bare = start_prometheus(targets)
    for server in (prometheus, bare):
        server.wait_until_up([d.address for d in daemons])
    prometheus.wait_for(
        "gpuwatch:node_gpu_models:count", lambda found: len(found) == 3, "the rules' figures"
    )
    # WHEN the fleet is read from the rules, from their expressions, and GPU by GPU
    recorded_source = PrometheusSource(prometheus.url, needs=Needs(per_node=True))
    recorded = recorded_source.read()
    evaluated_source = PrometheusSource(bare.url, needs=Needs(per_node=True))
    evaluated = evaluated_source.read()
    raw = PrometheusSource(prometheus.url).read()
    # THEN figures were read, and the table and the users view are the same all three ways
    for fleet in (recorded, evaluated):
        assert all(node.summary is not None and node.snapshot is None for node in fleet.nodes)
    assert all(node.summary is None and node.snapshot is not None for node in raw.nodes)
    table = [shown(row) for row in build_rows(raw)]
    assert [shown(row) for row in build_rows(recorded)] == table
    assert [shown(row) for row in build_rows(evaluated)] == table
    assert user_rows(recorded) == user_rows(evaluated) == user_rows(raw)
    # AND every node has its figures however it was read: from its GPUs, they are those
    # its daemon exports (less those moving from second to second) but for what only
    # pick's rule and a watch over time tell
    told = {node.name: node.figures for node in recorded.nodes}
    untold = dict.fromkeys(("gpus_free", "idle_held", *MOVING))
    for node in raw.nodes:
        figures = told[node.name]
        assert node.figures is not None and figures is not None
        assert replace(node.figures, **untold) == replace(figures, **untold)


@pytest.mark.slow
def test_a_node_in_focus_comes_with_its_gpus_beside_its_figures(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN two gpuwatch daemons behind a Prometheus that records no rules, read as figures
    node_b = SimNode("node-b", (40 * GIB,))
    daemons = start_daemons([SimNode("node-a", (0, 0)), node_b])
    prometheus = start_prometheus([Target(d.address) for d in daemons])
    prometheus.wait_until_up([d.address for d in daemons])
    source = PrometheusSource(prometheus.url, needs=Needs(per_node=True))
    source.read()
    # WHEN node-b's detail is opened (focus), read, then closed
    source.focus(["node-b"])
    opened = {node.name: node for node in source.read().nodes}
    source.focus(())
    closed = {node.name: node for node in source.read().nodes}
    # THEN only node-b came GPU by GPU while open, with its figures kept for its row
    b = opened["node-b"]
    assert b.snapshot is not None and b.summary is not None
    assert tuple(gpu.memory_free_bytes for gpu in b.snapshot.gpus) == node_b.free_bytes()
    assert b.leases == ()
    assert [p.memory_used_bytes for p in b.snapshot.processes] == [40 * GIB]
    assert opened["node-a"].snapshot is None
    assert build_rows(FleetState(0.0, "x", (b,)))[0].gpus == 1
    assert closed["node-b"].snapshot is None and closed["node-b"].summary is not None


SUMMARY = NodeSummary(
    gpus=8,
    gpus_free=3,
    most_free_bytes=80 * GIB,
    memory_free_bytes=300 * GIB,
    utilization_pct=42.5,
    hottest_c=71,
    power_w=2400.0,
    leases=2,
    idle_held=1,
    users=(("alice", 2, 60 * GIB), ("", 1, GIB)),
    models=("NVIDIA H100 80GB HBM3",),
)


@pytest.mark.parametrize("up", [True, False], ids=["up", "stale"])
def test_a_node_read_from_the_rules_is_a_row_of_its_figures(up: bool) -> None:
    # GIVEN a node as the recording rules describe it, current or stale
    node = NodeState("gpu-07", up=up, snapshot=None, data_at=-5.0, summary=SUMMARY)
    fleet = FleetState(taken_at=0.0, source="prometheus x", nodes=(node,))
    # WHEN the table's row and the users view are built
    (row,) = build_rows(fleet)
    users, silent, _ = user_rows(fleet)
    # THEN the row shows its figures; a stale node has no free GPU and no users counted
    assert (row.gpus, row.most_free_bytes, row.leases, row.models) == (
        8,
        80 * GIB,
        2,
        "NVIDIA H100 80GB HBM3",
    )
    assert row.gpus_free == (3 if up else None)
    assert row.users == frozenset({"alice"})
    assert [(u.user, u.nodes, u.gpus, u.memory_bytes) for u in users] == (
        [("alice", 1, 2, 60 * GIB), ("?", 1, 1, GIB)] if up else []
    )
    assert silent == 0


@pytest.mark.parametrize(("idle_after_s", "recorded"), [(600.0, True), (1800.0, False)])
def test_idle_holders_come_from_the_rules_only_at_their_window(
    idle_after_s: float, recorded: bool
) -> None:
    # GIVEN the screen's idle holders asked for 10 minutes, the rules' window, or 30
    # WHEN the queries of what changes slowly are made where the rules are recorded
    (_, idle) = summaries.slow_plan(recorded=True, group=2, idle_after_s=idle_after_s)
    # THEN the recorded series does for 10 minutes; another window is evaluated over it
    assert (idle.expression == "") is recorded
    assert recorded or "[1800s]" in idle.promql()


def test_a_users_memory_read_before_their_gpus_counts_one_gpu_at_least() -> None:
    # GIVEN each user's memory on a node, read at a refresh before their GPUs are
    memory = Sample("gpuwatch:node_user_memory_bytes:sum", {"user": "ana"}, float(3 << 30))
    gpus = Sample("gpuwatch:node_user_gpus:count", {"user": "ana"}, 2.0)
    # WHEN the node's users are read from what is held, then with their GPUs too
    # THEN a user with memory there holds a GPU at least, then as many as counted
    none_then = Sample("gpuwatch:node_user_gpus:count", {}, summaries.NO_USER)
    assert summaries.slow_figures([memory, none_then]).users == (("ana", 1, 3 << 30),)
    assert summaries.slow_figures([memory, gpus]).users == (("ana", 2, 3 << 30),)


def test_a_node_telling_more_free_gpus_than_it_has_shows_no_free_count() -> None:
    # GIVEN a daemon's figures saying 100 GPUs free of 2 (a node lying, or broken)
    samples = [
        Sample(node_figures.GPUS, {}, 2.0),
        Sample("gpuwatch_gpus_available", {}, 100.0),
        Sample(summaries.STAMP, {}, 1000.0),
    ]
    # WHEN its figures are read THEN its count of free GPUs is unknown, never "100/2"
    figures = summaries.figures(samples, summaries.slow_figures([]))
    assert (figures.summary.gpus, figures.summary.gpus_free) == (2, None)


def test_the_most_free_memory_of_a_split_gpu_is_its_largest_mig_devices() -> None:
    # GIVEN a whole GPU with 10 GiB free, and a MIG-enabled one with 70 GiB free in all,
    # its largest MIG device 20 GiB
    whole = GpuSample(0, "GPU-a", None, None, memory_free_bytes=10 * GIB)
    split = GpuSample(1, "GPU-b", None, None, memory_free_bytes=70 * GIB, mig_enabled=True)
    devices = [
        MigDevice(1, index, f"MIG-{index}", memory_free_bytes=size * GIB)
        for index, size in enumerate((20, 20, 10))
    ]
    # WHEN the node's figures are made THEN its most free is the MIG device's, not 70 GiB
    figures = node_figures.node_figures([whole, split], devices)
    assert figures.most_free_bytes == 20 * GIB
    assert figures.memory_free_bytes == 80 * GIB


ALERTS = ROOT / "examples" / "gpuwatch-alerts.yml"
DOWN_SUMMARY = "GPU node 10.0.0.9:19400 (job gpuwatch) cannot be scraped"
DOWN_DESCRIPTION = (
    "Prometheus's /targets page says why (refused, 401, timeout); `gpuwatch fleet --once` "
    "shows it down with that reason."
)


def alert_tests(tmp_path: Path) -> Path:
    """promtool's tests of the target alerts: a target never up beside one up; a job with
    no target at all."""
    up = [
        {"series": 'up{job="gpuwatch",instance="10.0.0.7:19400"}', "values": "1x20"},
        {"series": 'up{job="gpuwatch",instance="10.0.0.9:19400"}', "values": "0x20"},
        {"series": 'up{job="node",instance="10.0.0.9:9100"}', "values": "0x20"},
    ]
    down = {
        "exp_labels": {
            "severity": "warn",
            "job": "gpuwatch",
            "instance": "10.0.0.9:19400",
        },
        "exp_annotations": {"summary": DOWN_SUMMARY, "description": DOWN_DESCRIPTION},
    }
    absent = {
        "exp_labels": {"severity": "warn", "job": "gpuwatch"},
        "exp_annotations": {
            "summary": "Prometheus scrapes no target of job gpuwatch",
            "description": "Check the scrape config (prometheus.yml) or its service "
            "discovery: no GPU node of the job is watched.",
        },
    }
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": up,
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "GpuwatchTargetDown", "exp_alerts": []},
                    {"eval_time": "6m", "alertname": "GpuwatchTargetDown", "exp_alerts": [down]},
                    {"eval_time": "15m", "alertname": "GpuwatchTargetsAbsent", "exp_alerts": []},
                ],
            },
            {
                "interval": "1m",
                "input_series": [up[2]],
                "alert_rule_test": [
                    {"eval_time": "9m", "alertname": "GpuwatchTargetsAbsent", "exp_alerts": []},
                    {
                        "eval_time": "11m",
                        "alertname": "GpuwatchTargetsAbsent",
                        "exp_alerts": [absent],
                    },
                ],
            },
        ],
    }
    path = tmp_path / "alerts.test.yml"
    path.write_text(yaml.safe_dump(tests))
    return path


def test_a_target_never_up_alerts_and_so_does_a_job_with_no_target(tmp_path: Path) -> None:
    # GIVEN a gpuwatch target never up beside one that is, a node_exporter down, and a
    # Prometheus with no gpuwatch target at all
    tests = alert_tests(tmp_path)
    # WHEN promtool checks the shipped alerts and runs these tests
    checked = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    done = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )
    # THEN the target never up alerts after 5 minutes (not the node_exporter), and the job
    # with no target after 10
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert done.returncode == 0, done.stdout + done.stderr
