"""Checks only a real driver can answer. Marked `gpu`: skipped on machines without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def smi(*fields: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[value.strip() for value in line.split(",")] for line in out.strip().splitlines()]


def gpuwatch_json() -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "status", "--json", "--backend", "nvml"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_status_agrees_with_nvidia_smi() -> None:
    rows = smi(
        "index",
        "uuid",
        "name",
        "pci.bus_id",
        "memory.total",
        "memory.used",
        "memory.free",
        "power.limit",
    )
    gpus = gpuwatch_json()["gpus"]
    assert isinstance(gpus, list) and len(gpus) == len(rows)
    for gpu, (index, uuid, name, bus, total, used, free, limit) in zip(gpus, rows, strict=True):
        assert (gpu["index"], gpu["uuid"], gpu["name"]) == (int(index), uuid, name)
        assert gpu["pci_bus_id"].lower() == bus.lower()
        assert gpu["memory_total_bytes"] // MIB == int(total)
        # Memory moves between the two reads; a few MiB of slack.
        assert abs(gpu["memory_free_bytes"] // MIB - int(free)) <= 64
        assert abs(gpu["memory_used_bytes"] // MIB - int(used)) <= 64
        assert gpu["power_limit_w"] == pytest.approx(float(limit), abs=1)


@pytest.mark.parametrize("fmt", ["uuid", "index"])
def test_torch_sees_exactly_the_gpu_pick_chose(fmt: str) -> None:
    torch_says = (
        "import torch; print(torch.cuda.device_count(), "
        "'GPU-' + str(torch.cuda.get_device_properties(0).uuid))"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "pick",
            "-v",
            # What is checked is which GPU torch sees, not whether the GPU is idle: a test
            # before this one may have left it busy for a moment.
            "--allow-busy",
            "--format",
            fmt,
            "--",
            sys.executable,
            "-c",
            torch_says,
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
    )
    count, torch_uuid = out.stdout.split()
    chosen_uuid = out.stderr.split("(")[1].split(")")[0]  # "gpuwatch: chose GPU 0 (GPU-...)"
    assert (int(count), torch_uuid) == (1, chosen_uuid)


def test_select_refuses_after_the_driver_started() -> None:
    code = (
        "import torch, gpuwatch\n"
        "torch.cuda.is_available()  # starts the driver, without torch's own flag\n"
        "try:\n    gpuwatch.select()\n"
        "except gpuwatch.CudaAlreadyInitializedError as error:\n    print(error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "CUDA driver is initialised" in out


def test_mig_mode_and_devices_agree_with_nvidia_smi() -> None:
    # Read-only: MIG mode is never changed here, whatever the GPU's mode is.
    data = gpuwatch_json()
    modes = [row[0] for row in smi("mig.mode.current")]
    gpus = data["gpus"]
    assert isinstance(gpus, list)
    assert [gpu["mig_enabled"] for gpu in gpus] == [mode == "Enabled" for mode in modes]
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    smi_migs = {word.rstrip(")") for word in listed.stdout.split() if word.startswith("MIG-")}
    devices = data["mig_devices"]
    assert isinstance(devices, list)
    assert {device["uuid"] for device in devices} == smi_migs


def test_the_daemons_node_figures_agree_with_nvidia_smi() -> None:
    # GIVEN the node's GPUs as the driver reports them, read by the daemon's own code
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwatch.backends.nvml import NvmlBackend
    from gpuwatch.daemon.metrics import exposition
    from gpuwatch.daemon.view import View
    from gpuwatch.sampling.poller import PollState

    backend = NvmlBackend()
    try:
        snapshot = backend.sample()
    finally:
        backend.close()
    view = View(PollState(snapshot, None, 0.0, 1), None, ())
    text = exposition(view).decode()
    node = {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("gpuwatch_node_")
    }
    # WHEN nvidia-smi is asked the same
    rows = smi("memory.free", "temperature.gpu", "power.draw")
    free_mib = [int(free) for free, _, _ in rows]
    # THEN the node's figures are those of its GPUs together (memory and power move a little
    # between the two reads)
    assert node["gpuwatch_node_gpus"] == len(rows)
    assert abs(node["gpuwatch_node_memory_free_bytes"] // MIB - sum(free_mib)) <= 64 * len(rows)
    assert abs(node["gpuwatch_node_memory_free_max_bytes"] // MIB - max(free_mib)) <= 64
    hottest = max(int(temperature) for _, temperature, _ in rows)
    assert abs(node["gpuwatch_node_temperature_max_celsius"] - hottest) <= 3
    power = sum(float(draw) for _, _, draw in rows)
    assert node["gpuwatch_node_power_watts"] == pytest.approx(power, rel=0.25, abs=30)
