"""MIG faults: devices that vanish in a reconfiguration, a lost parent GPU, waiting for a device."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuwatch.backends.mig_changes import MigChanges
from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import MigDevice
from tests.helpers.cli import run_cli
from tests.helpers.mig import NODE, PICK
from tests.helpers.wait import wait_until

SMALL = MigDevice(0, 2, "MIG-small", profile="1g.10gb")
BIG = MigDevice(0, 0, "MIG-big", profile="3g.40gb")


def test_a_vanished_device_is_reported_for_a_while_then_forgotten() -> None:
    changes = MigChanges(keep_s=300)
    assert changes.notes(0, [BIG, SMALL], now=0) == []
    # WHEN the 1g.10gb disappears
    notes = changes.notes(0, [BIG], now=10)
    # THEN it is reported, until the time to keep it has passed
    assert notes == ["MIG device 0:2 (1g.10gb) MIG-small vanished (reconfigured)"]
    assert changes.notes(0, [BIG], now=300) == notes
    assert changes.notes(0, [BIG], now=311) == []


def test_a_device_that_comes_back_is_no_longer_reported_and_gpus_are_apart() -> None:
    changes = MigChanges()
    changes.notes(0, [BIG, SMALL], now=0)
    changes.notes(1, [MigDevice(1, 0, "MIG-other")], now=0)
    assert changes.notes(0, [BIG], now=1) != []
    assert changes.notes(0, [BIG, SMALL], now=2) == []
    assert changes.notes(1, [MigDevice(1, 0, "MIG-other")], now=2) == []


def test_the_simulator_reports_a_reconfiguration_on_the_gpu(tmp_path: Path) -> None:
    # GIVEN a simulated MIG node, sampled
    path = tmp_path / "node.toml"
    path.write_text(NODE)
    backend = SimBackend(path)
    before = backend.sample()
    # WHEN GPU 0's 1g.10gb is destroyed
    path.write_text(NODE.replace(', "1g.10gb"]', "]").replace('"mig-node"', '"mig-node2"'))
    after = backend.sample()
    # THEN GPU 0 reports it, still MIG-enabled with two devices; GPU 1 is untouched
    gone = before.mig_devices[2]
    assert f"MIG device 0:2 (1g.10gb) {gone.uuid} vanished" in (after.gpus[0].error or "")
    assert after.gpus[0].mig_enabled and len(after.mig_devices) == 2
    assert after.gpus[1].error is None


def test_a_lost_gpu_names_its_mig_devices_in_the_simulator(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NODE)
    backend = SimBackend(path)
    backend.sample()
    path.write_text(NODE.replace('mig = ["3g.40gb"', 'fault = "lost"\nmig = ["3g.40gb"', 1))
    after = backend.sample()
    assert after.gpus[0].error == (
        "GPU is lost (with its MIG devices 0:0 (3g.40gb), 0:1 (2g.20gb), 0:2 (1g.10gb))"
    )
    assert after.mig_devices == () and after.gpus[1].error is None


def test_a_job_waiting_for_a_mig_device_gets_it_when_freed(tmp_path: Path) -> None:
    # GIVEN a job holds the only 1g.10gb MIG device
    path, go = tmp_path / "node.toml", tmp_path / "go"
    path.write_text(NODE)
    env = {**os.environ, "GPUWATCH_SIM": str(path)}
    hold = ["sh", "-c", f"echo held; while [ ! -e {go} ]; do sleep 0.05; done"]
    holder = subprocess.Popen(
        [*PICK, "--mig", "1g.10gb", "--", *hold], env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    # WHEN another job waits for one, and the holder ends
    note = tmp_path / "waiter"
    record = ["sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {note}']
    waiter = subprocess.Popen(
        [*PICK, "--mig", "1g.10gb", "--wait", "--timeout", "2m", "--", *record],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: any(p.name.endswith(".wait") for p in (tmp_path / "leases").iterdir()),
            "the second job to queue",
            timeout_s=120,
            interval_s=0.02,
        )
        go.touch()
        holder.communicate(timeout=60)
        _, err = waiter.communicate(timeout=120)
    finally:
        go.touch()
        for process in (holder, waiter):
            if process.poll() is None:
                process.kill()
                process.communicate()
    # THEN the waiter gets the MIG device
    assert waiter.returncode == 0, err
    small = SimBackend(path).sample().mig_devices[2]
    assert note.read_text().strip() == small.uuid


def test_pick_mig_help_explains_one_device_per_command() -> None:
    result = run_cli("pick", "--help", env={"COLUMNS": "100"})
    assert "--mig PROFILE|any" in result.stdout
    assert "one per COMMAND" in " ".join(result.stdout.split())  # help is wrapped to fit
