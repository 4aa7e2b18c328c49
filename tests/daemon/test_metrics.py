"""Prometheus metrics from a snapshot, and the shipped dashboard and alerts that use them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import Lease, Snapshot
from gpuwatch.placement.gpus import choose
from gpuwatch.request import Request
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.daemon import scrape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def sim_snapshot() -> Snapshot:
    return SimBackend(4, clock=lambda: FROZEN_TIME).sample()


def test_values_are_in_base_units() -> None:
    snapshot = sim_snapshot()
    metrics = scrape(snapshot, [])
    gpu0 = snapshot.gpus[0]
    by_gpu = {
        sample.labels["gpu"]: sample.value for sample in metrics["gpuwatch_utilization_ratio"]
    }
    assert by_gpu["0"] == gpu0.utilization_pct / 100  # type: ignore[operator]
    clocks = {s.labels["gpu"]: s.value for s in metrics["gpuwatch_sm_clock_hertz"]}
    assert clocks["0"] == gpu0.sm_clock_mhz * 1e6  # type: ignore[operator]
    assert metrics["gpuwatch_gpu_info"][0].labels["model_name"] == "NVIDIA H100 80GB HBM3"


def test_unreported_values_are_left_out_and_faults_show_as_down() -> None:
    snapshot = sim_snapshot()
    lost = snapshot.gpus[1].__class__(
        index=1, uuid=snapshot.gpus[1].uuid, name="H100", pci_bus_id=None, error="GPU is lost"
    )
    broken = Snapshot(
        snapshot.taken_at, snapshot.hostname, None, None, (snapshot.gpus[0], lost), ()
    )
    metrics = scrape(broken, [])
    assert {s.labels["gpu"] for s in metrics["gpuwatch_memory_free_bytes"]} == {"0"}
    assert {s.labels["gpu"]: s.value for s in metrics["gpuwatch_gpu_up"]} == {"0": 1, "1": 0}
    assert not [s for s in metrics["gpuwatch_fan_ratio"]], "an H100 has no fan: no sample"


def test_leases_are_counted_per_gpu_and_mode() -> None:
    snapshot = sim_snapshot()
    uuid = str(snapshot.gpus[2].uuid)
    leases = [
        Lease(uuid, 2, 10, "alice", "a", 0.0, None),
        Lease(uuid, 2, 11, "bob", "b", 0.0, 5 << 30),
    ]
    metrics = scrape(snapshot, leases)
    held = {(s.labels["gpu"], s.labels["mode"]): s.value for s in metrics["gpuwatch_leases"]}
    assert held[("2", "exclusive")] == 1 and held[("2", "shared")] == 1
    assert held[("0", "exclusive")] == 0
    declared = {s.labels["gpu"]: s.value for s in metrics["gpuwatch_lease_declared_memory_bytes"]}
    assert declared["2"] == 5 << 30


def test_before_the_first_sample_only_the_daemons_state_is_exported() -> None:
    metrics = scrape(None, [], sampling=False)
    assert metrics["gpuwatch_sampling_up"][0].value == 0
    assert "gpuwatch_memory_free_bytes" not in metrics


def test_dashboard_and_alerts_use_only_metrics_that_exist() -> None:
    exported = set(scrape(sim_snapshot(), [Lease("x", 0, 1, "u", "c", 0.0)]))
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions.append((EXAMPLES / "gpuwatch-alerts.yml").read_text())
    used = {name for text in expressions for name in re.findall(r"gpuwatch_[a-z_]+", text)}
    assert used, "the dashboard should chart gpuwatch metrics"
    assert used <= exported, sorted(used - exported)
    assert "gpuwatch" in (EXAMPLES / "prometheus.yml").read_text()


def test_a_gpu_lost_before_its_first_sample_is_named_by_what_is_known() -> None:
    # GIVEN a GPU that could tell nothing but its index before it was lost
    snapshot = sim_snapshot()
    lost = snapshot.gpus[0].__class__(
        index=2, uuid=None, name=None, pci_bus_id=None, error="GPU is lost"
    )
    metrics = scrape(Snapshot(snapshot.taken_at, "vm", None, None, (lost,), ()), [])
    # THEN it is down, with no made-up identity
    (up,) = metrics["gpuwatch_gpu_up"]
    assert up.value == 0 and up.labels["gpu"] == "2" and up.labels["hostname"] == "vm"
    assert up.labels["uuid"] == "" and up.labels["pci_bus_id"] == ""
    # AND the alert on it says only what is known, never "GPU 2 () on vm"
    alerts = (EXAMPLES / "gpuwatch-alerts.yml").read_text()
    for label in ("uuid", "pci_bus_id"):
        uses = re.findall(r"\{\{[^}]*\$labels\." + label + r"[^}]*\}\}", alerts)
        assert all(use.startswith("{{ with ") for use in uses), uses


def test_while_the_snapshot_is_not_current_every_gpu_is_down_and_no_value_is_sent() -> None:
    metrics = scrape(sim_snapshot(), [], sampling=False)
    assert {sample.value for sample in metrics["gpuwatch_gpu_up"]} == {0}
    assert len(metrics["gpuwatch_gpu_up"]) == 4
    assert "gpuwatch_memory_free_bytes" not in metrics
    assert metrics["gpuwatch_sample_timestamp_seconds"][0].value == FROZEN_TIME


def test_the_dashboards_stat_panels_carry_no_timeseries_options() -> None:
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    stats = [panel for panel in dashboard["panels"] if panel["type"] == "stat"]
    assert stats and not [panel["title"] for panel in stats if "legend" in panel["options"]]


def test_sampling_is_down_until_a_first_snapshot_exists() -> None:
    # GIVEN a daemon that has not sampled yet, and nothing gone wrong
    metrics = scrape(None, [], sampling=True)
    # THEN sampling is not reported up, and no GPU series is there
    assert [s.value for s in metrics["gpuwatch_sampling_up"]] == [0]
    assert "gpuwatch_gpu_up" not in metrics


@pytest.mark.parametrize("lease_mb", [None, 0, 5 << 10])
def test_each_gpu_is_available_exactly_when_pick_would_give_it_to_another_users_job(
    lease_mb: int | None,
) -> None:
    # GIVEN a node of busy GPUs and an idle one, the idle one bare, leased exclusively or
    # leased shared (5 GiB declared)
    snapshot = sim_snapshot()
    idle = next(
        gpu for gpu in snapshot.gpus if gpu.utilization_pct == 0 and gpu.memory_used_bytes == 0
    )
    leases = (
        []
        if lease_mb is None
        else [Lease(str(idle.uuid), idle.index, 10, "alice", "a", 0.0, (lease_mb << 20) or None)]
    )
    # WHEN it is scraped
    metrics = scrape(snapshot, leases)
    available = {int(s.labels["gpu"]): s.value for s in metrics["gpuwatch_memory_available_bytes"]}
    # THEN a GPU has its free memory available where pick, asked for that GPU alone, would
    # choose it (the idle one only, and only while no lease holds it), and none elsewhere
    for gpu in snapshot.gpus:
        asked = Request(allowed=frozenset({gpu.index}))
        chosen = choose(snapshot, asked, leases=leases).chosen
        assert available[gpu.index] == (gpu.memory_free_bytes if chosen else 0), gpu.index
    assert [g for g, value in available.items() if value] == ([idle.index] if not leases else [])
    # AND the node counts the GPUs it would give
    assert metrics["gpuwatch_gpus_available"][0].value == (0 if leases else 1)


def test_the_node_exports_the_figures_its_fleet_row_shows_leaving_out_a_lost_gpu() -> None:
    # GIVEN a node of four GPUs, one of them lost (its last readings kept), and one lease
    snapshot = sim_snapshot()
    lost = snapshot.gpus[1]
    gpus = tuple(
        msgspec.structs.replace(gpu, error="GPU is lost") if gpu is lost else gpu
        for gpu in snapshot.gpus
    )
    snapshot = msgspec.structs.replace(snapshot, gpus=gpus)
    readable = [gpu for gpu in gpus if gpu.error is None]
    leases = [Lease(str(gpus[0].uuid), 0, 10, "alice", "a", 0.0, None)]
    # WHEN it is scraped
    metrics = scrape(snapshot, leases)
    node = {name: samples[0].value for name, samples in metrics.items() if "_node_" in name}
    # THEN one series each tells the node's figures, from its readable GPUs alone
    free = [gpu.memory_free_bytes or 0 for gpu in readable]
    assert node == {
        "gpuwatch_node_gpus": 4,
        "gpuwatch_node_memory_free_bytes": sum(free),
        "gpuwatch_node_memory_free_max_bytes": max(free),
        "gpuwatch_node_utilization_ratio": pytest.approx(
            sum(gpu.utilization_pct or 0 for gpu in readable) / 300
        ),
        "gpuwatch_node_temperature_max_celsius": max(gpu.temperature_c or 0 for gpu in readable),
        "gpuwatch_node_power_watts": pytest.approx(sum(gpu.power_w or 0 for gpu in readable)),
        "gpuwatch_node_leases": 1,
    }
    assert all(s.labels == {"hostname": snapshot.hostname} for s in metrics["gpuwatch_node_gpus"])


def test_a_node_whose_sampling_fails_exports_no_figures() -> None:
    # GIVEN a node whose snapshot is not current WHEN it is scraped
    metrics = scrape(sim_snapshot(), [], sampling=False)
    # THEN it tells no figure of its node, as it tells no value of its GPUs
    assert not [name for name in metrics if name.startswith("gpuwatch_node_")]
