"""MIG end to end: real pynvml over ../shared/fakenvml's MIG scenario (skipped without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.fakenvml import (
    NEEDS_FAKENVML,
    SCENARIOS,
    gpuwatch,
    records,
    size,
    total_calls,
)

pytestmark = [pytest.mark.slow, NEEDS_FAKENVML]

MIG_A100 = SCENARIOS / "mig-a100.txt"


def nvml_env(library_dir: Path, scenario: Path) -> dict[str, str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_dir), "FAKENVML_SCENARIO": str(scenario)}
    env.pop("GPUWATCH_SIM", None)
    env["GPUWATCH_BACKEND"] = "nvml"
    return env


def test_status_json_reads_every_mig_device_and_places_processes(library_dir: Path) -> None:
    # GIVEN the MIG scenario: GPU 0 with 3 MIG devices, GPU 1 with MIG disabled
    result = gpuwatch(library_dir, MIG_A100, "status", "--json", "--backend", "nvml")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    migs, procs = records(MIG_A100, "mig"), records(MIG_A100, "proc")
    # THEN each GPU's MIG mode is known and GPU 0's utilization is not invented
    assert [gpu["mig_enabled"] for gpu in data["gpus"]] == [True, False]
    assert data["gpus"][0]["utilization_pct"] is None and data["gpus"][0]["error"] is None
    # AND each MIG device is read with the UUID, profile, ids and memory nvitop shows
    got = data["mig_devices"]
    assert [m["uuid"] for m in got] == [m["uuid"] for m in migs]
    assert [m["profile"] for m in got] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert [(m["gpu_instance_id"], m["compute_instance_id"]) for m in got] == [
        (1, 0),
        (5, 0),
        (13, 0),
    ]
    mib = 1 << 20
    assert [m["memory_total_bytes"] for m in got] == [39936 * mib, 19968 * mib, 9984 * mib]
    for index, device in enumerate(got):
        used = sum(size(p["used"]) for p in procs if p.get("mig") == str(index))
        assert device["memory_used_bytes"] == used
        assert device["memory_free_bytes"] == device["memory_total_bytes"] - used
    # AND each process is placed in the MIG device its record names
    placed = {p["pid"]: p["mig_uuid"] for p in data["processes"]}
    for want in procs:
        expected = got[int(want["mig"])]["uuid"] if "mig" in want else None
        assert placed[int(want["pid"])] == expected


def test_the_table_shows_mig_devices_under_their_gpu(library_dir: Path) -> None:
    result = gpuwatch(library_dir, MIG_A100, "status", "--backend", "nvml")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("[0] NVIDIA A100-SXM4-80GB") and "|  MIG |" in lines[1]
    assert lines[2].split("|")[0].split() == ["0:0", "3g.40gb"]
    assert "32.0 /  39.0 GiB" in lines[2] and "GI 1 CI 0" in lines[2]
    assert [line.split("|")[0].split()[:2] for line in lines if "GI " in line] == [
        ["0:0", "3g.40gb"],
        ["0:1", "2g.20gb"],
        ["0:2", "1g.10gb"],
    ]


def test_pick_never_hands_out_the_mig_gpu_whole(library_dir: Path) -> None:
    # WHEN a whole GPU is asked for with GPU 1 excluded
    result = gpuwatch(library_dir, MIG_A100, "pick", "--backend", "nvml", "--exclude", "1")
    # THEN GPU 0 is refused, and the message points to its free MIG device
    assert result.returncode == 4
    assert "GPU 0: MIG enabled" in result.stderr
    assert "1 MIG device is free: use --mig PROFILE|any" in result.stderr
    # AND --mig any gets the idle 1g.10gb
    chosen = gpuwatch(library_dir, MIG_A100, "pick", "--backend", "nvml", "--mig", "any")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == records(MIG_A100, "mig")[2]["uuid"]


RECONFIGURE = """
import os, sys
from gpuwatch.backends.nvml import NvmlBackend
scenario, replacement = sys.argv[1], sys.argv[2]
with NvmlBackend() as backend:
    before = backend.sample()
    os.replace(replacement, scenario)
    after = backend.sample()
print(len(before.mig_devices), len(after.mig_devices), after.gpus[0].error)
"""


def test_a_reconfigured_gpu_reports_its_vanished_mig_device(
    library_dir: Path, tmp_path: Path
) -> None:
    # GIVEN a client reading the MIG scenario
    scenario, replacement = tmp_path / "node.txt", tmp_path / "next.txt"
    text = MIG_A100.read_text()
    scenario.write_text(text)
    # WHEN GPU 0's idle 1g.10gb MIG device is destroyed while it runs
    replacement.write_text(
        "\n".join(line for line in text.splitlines() if "profile=1g.10gb" not in line)
    )
    result = subprocess.run(
        [sys.executable, "-c", RECONFIGURE, str(scenario), str(replacement)],
        env=nvml_env(library_dir, scenario),
        capture_output=True,
        text=True,
        check=False,
    )
    # THEN the next sample lists two devices, and GPU 0 reports the one that vanished
    assert result.returncode == 0, result.stderr
    before, after, error = result.stdout.strip().split(" ", 2)
    assert (before, after) == ("3", "2")
    assert "MIG device 0:2 (1g.10gb) MIG-c48b2d7e" in error and "vanished" in error


@pytest.mark.parametrize(
    ("scenario", "most"),
    [(SCENARIOS / "node-8gpu.txt", 140), (MIG_A100, 117)],
    ids=["8-gpu-node-unchanged", "mig-node-below-nvitop"],
)
def test_call_counts_of_a_one_shot_status(
    library_dir: Path, tmp_path: Path, scenario: Path, most: int
) -> None:
    # 140: gpuwatch's count on the 8-GPU node before MIG (117), plus one MPS process list,
    # one read of the processes' SM utilization and the minor number per GPU; 117: nvitop -1's
    # on the MIG node
    stats = tmp_path / "calls.stats"
    result = gpuwatch(library_dir, scenario, "status", "--json", "--backend", "nvml", stats=stats)
    assert result.returncode == 0, result.stderr
    assert total_calls(stats) <= most
    if scenario.name == "node-8gpu.txt":
        assert "Mig" not in stats.read_text(), "GPUs without MIG cost no MIG call"


def test_a_preset_of_mig_uuids_is_the_set_to_choose_from(library_dir: Path) -> None:
    # GIVEN Slurm gave the job the busy 2g.20gb and the idle 1g.10gb MIG devices
    busy, idle = (m["uuid"] for m in records(MIG_A100, "mig")[1:])
    env = {**nvml_env(library_dir, MIG_A100), "CUDA_VISIBLE_DEVICES": f"{busy},{idle}"}
    # WHEN it picks without --mig
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "pick"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    # THEN it gets the idle one of the two
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == idle
