"""MIG devices shown: the status table, its JSON, Prometheus series and the daemon's snapshot."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwatch.backends.daemon_client import DaemonBackend
from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.table import render
from gpuwatch.models import Lease, Snapshot
from tests.helpers.cli import FROZEN_TIME, run_cli
from tests.helpers.daemon import get_json, running_daemon, scrape
from tests.helpers.mig import NODE

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mig-node.toml"


def node_snapshot(tmp_path: Path) -> tuple[Path, Snapshot]:
    path = tmp_path / "mig-node.toml"
    path.write_text(NODE)
    return path, SimBackend(path, clock=lambda: FROZEN_TIME).sample()


def test_the_table_lists_mig_devices_with_their_processes_and_leases_under_their_gpu(
    tmp_path: Path,
) -> None:
    # GIVEN GPU 0 in MIG mode, a process in 0:0 and 0:1, and a lease on 0:2
    _, snapshot = node_snapshot(tmp_path)
    idle = snapshot.mig_devices[2]
    leases = [Lease(str(idle.uuid), 0, 99, "carol", "python infer.py", 0.0, None, "L1")]
    # WHEN the table is drawn
    lines = render(snapshot, leases=leases, width=120).splitlines()
    # THEN each MIG device has its own line under GPU 0, before GPU 1
    gpu0, gpu1 = (n for n, line in enumerate(lines) if line.startswith(("[0]", "[1]")))
    mig_lines = [n for n, line in enumerate(lines) if line.lstrip().startswith("0:")]
    assert gpu0 < mig_lines[0] and mig_lines[-1] < gpu1
    assert "  0:2  1g.10gb" in lines[mig_lines[2]]
    assert "0.0 /   9.8 GiB" in lines[mig_lines[2]] and "GI 3 CI 0" in lines[mig_lines[2]]
    # AND each process and lease is under its MIG device, indented one step more
    assert "71001" in lines[mig_lines[0] + 1] and "72001" in lines[mig_lines[1] + 1]
    assert lines[mig_lines[2] + 1].startswith("      leased by carol (pid 99, exclusive")
    # AND the MIG-enabled GPU says why it has no utilization
    assert "|  MIG |" in lines[gpu0]


def test_status_json_carries_mig_devices_with_the_models_field_names(tmp_path: Path) -> None:
    path, snapshot = node_snapshot(tmp_path)
    result = run_cli("status", "--sim", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [gpu["mig_enabled"] for gpu in data["gpus"]] == [True, False]
    assert [m["profile"] for m in data["mig_devices"]] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert set(data["mig_devices"][0]) == {
        "gpu_index",
        "index",
        "uuid",
        "name",
        "profile",
        "gpu_instance_id",
        "compute_instance_id",
        "memory_total_bytes",
        "memory_used_bytes",
        "memory_free_bytes",
        "error",
    }
    in_mig = {p["pid"]: p["mig_uuid"] for p in data["processes"]}
    migs = snapshot.mig_devices
    assert in_mig == {71001: migs[0].uuid, 72001: migs[1].uuid, 73001: None}


def test_metrics_have_mig_series_labelled_with_parent_uuid_profile_and_ids(
    tmp_path: Path,
) -> None:
    _, snapshot = node_snapshot(tmp_path)
    busy = snapshot.mig_devices[0]
    metrics = scrape(snapshot, [Lease(str(busy.uuid), 0, 5, "u", "c", 0.0, 1 << 30, "L")])
    (sample,) = [
        s for s in metrics["gpuwatch_mig_memory_used_bytes"] if s.labels["uuid"] == busy.uuid
    ]
    assert sample.labels == {
        "gpu": "0",
        "uuid": str(busy.uuid),
        "profile": "3g.40gb",
        "gpu_instance_id": "1",
        "compute_instance_id": "0",
        "hostname": "mig-node",
    }
    assert sample.value == busy.memory_used_bytes
    enabled = {s.labels["gpu"]: s.value for s in metrics["gpuwatch_mig_enabled"]}
    assert enabled == {"0": 1, "1": 0}
    shared = [
        s.value
        for s in metrics["gpuwatch_mig_leases"]
        if s.labels["uuid"] == busy.uuid and s.labels["mode"] == "shared"
    ]
    assert shared == [1]
    processes = {s.labels["profile"]: s.value for s in metrics["gpuwatch_mig_processes"]}
    assert processes == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 0}


def test_the_daemon_serves_mig_devices_to_its_clients(tmp_path: Path) -> None:
    with running_daemon(tmp_path, scenario=NODE) as (_, socket_path, _):
        status, data = get_json(socket_path, "/v1/snapshot")
        with DaemonBackend(str(socket_path)) as client:
            snapshot = client.sample()
    assert status == 200 and len(data["mig_devices"]) == 3
    assert [m.label for m in snapshot.mig_devices_of(0)] == ["0:0", "0:1", "0:2"]
    assert snapshot.gpus[0].mig_enabled is True


def test_the_readme_shows_what_status_prints_for_the_example_mig_node() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "mig.md").read_text()
    shown = readme.split("$ gpuwatch status --sim examples/mig-node.toml\n", 1)[1].split("```")[0]
    result = run_cli("status", "--sim", str(EXAMPLE), env={"COLUMNS": "80"})

    # GPU lines carry the time and simulated temperatures: the MIG and process lines do not
    def steady(text: str) -> list[str]:
        return [line for line in text.splitlines()[1:] if not line.startswith("[")]

    assert steady(result.stdout) == steady(shown) and len(steady(shown)) == 7
