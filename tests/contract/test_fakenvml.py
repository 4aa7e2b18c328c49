"""The real pynvml path, end to end, over the simulated driver library in ../shared/fakenvml.

Skipped where that library's sources (or a C compiler) are not at hand: CI
machines without ../shared still run everything else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fakenvml import (
    NEEDS_FAKENVML,
    SCENARIOS,
    gpuwatch,
    records,
    size,
    total_calls,
)
from tests.helpers.imports import (
    HEAVY_FOR_COMMANDS,
    PICK_ON_THE_DRIVER_MAY_LOAD,
    STATUS_ON_THE_DRIVER_MAY_LOAD,
    gpuwatch_modules,
)

pytestmark = [pytest.mark.slow, NEEDS_FAKENVML]


def test_status_json_shows_every_gpu_and_process_of_the_8_gpu_node(library_dir: Path) -> None:
    scenario = SCENARIOS / "node-8gpu.txt"
    result = gpuwatch(library_dir, scenario, "status", "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    assert (data["driver_version"], data["cuda_driver_version"]) == ("580.95.05", "13.0")
    gpus, procs = records(scenario, "gpu"), records(scenario, "proc")
    assert len(data["gpus"]) == len(gpus) == 8
    for got, want in zip(data["gpus"], gpus, strict=True):
        assert got["error"] is None
        assert (got["name"], got["uuid"]) == (want["name"], want["uuid"])
        assert got["pci_bus_id"] == want["bus"]
        used = sum(size(p["used"]) for p in procs if int(p["gpu"]) == got["index"])
        used = size(want["used"]) if "used" in want else used
        assert got["memory_total_bytes"] == size(want["total"])
        assert got["memory_used_bytes"] == used
        assert got["memory_reserved_bytes"] == size(want["reserved"])
        assert got["memory_free_bytes"] == size(want["total"]) - used - size(want["reserved"])
        assert got["utilization_pct"] == int(want["util"])
        assert got["temperature_c"] == int(want["temp"])
        assert got["power_w"] == float(want["power"].rstrip("W"))
        assert got["sm_clock_mhz"] == int(want["sm_clock"])
    got_procs = {(p["gpu_index"], p["pid"]): p for p in data["processes"]}
    assert len(got_procs) == len(procs) == 40
    for want in procs:
        got = got_procs[(int(want["gpu"]), int(want["pid"]))]
        assert got["memory_used_bytes"] == size(want["used"])
    assert got_procs[(5, 63006)]["kind"] == "compute+graphics"


def test_status_json_lists_mps_clients_through_the_real_bindings(
    library_dir: Path, tmp_path: Path
) -> None:
    # GIVEN a GPU shared through MPS: the server, and two clients the driver lists apart
    scenario = tmp_path / "mps.txt"
    scenario.write_text(
        'gpu name="NVIDIA H100 80GB HBM3"\n'
        "proc gpu=0 pid=4100 used=300MiB kind=compute name=nvidia-cuda-mps-server\n"
        'proc gpu=0 pid=4101 used=2GiB kind=mps name="python infer.py"\n'
        'proc gpu=0 pid=4102 used=1GiB kind=mps name="python infer.py"\n'
    )
    # WHEN status reads it
    result = gpuwatch(library_dir, scenario, "status", "--json")
    assert result.returncode == 0, result.stderr
    # THEN the clients are there, as MPS processes with their memory
    processes = json.loads(result.stdout)["processes"]
    assert [(p["pid"], p["kind"], p["memory_used_bytes"]) for p in processes] == [
        (4100, "compute", 300 << 20),
        (4101, "mps", 2 << 30),
        (4102, "mps", 1 << 30),
    ]


RUN_THEN_LIST_LOADED = """
import sys
from gpuwatch.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    assert done.code == 0, done.code
print(sorted(name for name, module in sys.modules.items() if type(module).__name__ == "module"))
"""


@pytest.mark.parametrize(
    ("argv", "budget"),
    [
        (["pick", "-n", "2", "--allow-busy"], PICK_ON_THE_DRIVER_MAY_LOAD),
        (["status"], STATUS_ON_THE_DRIVER_MAY_LOAD),
        (["status", "--json"], STATUS_ON_THE_DRIVER_MAY_LOAD),
    ],
    ids=["pick", "status", "status-json"],
)
def test_a_command_over_the_driver_loads_only_what_it_uses(
    library_dir: Path, tmp_path: Path, argv: list[str], budget: frozenset[str]
) -> None:
    # WHEN a command reads the GPUs through the real bindings (pick in print mode: nothing is
    # exec'd), with no daemon up
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(library_dir),
        "FAKENVML_SCENARIO": str(SCENARIOS / "node-8gpu.txt"),
        "GPUWATCH_LEASE_DIR": str(tmp_path),
        "GPUWATCH_SOCKET": str(tmp_path / "no-daemon.sock"),
    }
    result = subprocess.run(
        [sys.executable, "-c", RUN_THEN_LIST_LOADED, *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = set(json.loads(result.stdout.splitlines()[-1].replace("'", '"')))
    loaded = {name.split(".")[0] for name in modules}
    # THEN pynvml is loaded, but no other heavy library, which the command does not use
    assert "pynvml" in loaded
    assert loaded.isdisjoint(set(HEAVY_FOR_COMMANDS) - {"pynvml"})
    # AND of gpuwatch only the modules of its budget
    assert gpuwatch_modules(modules) - budget == set()


def test_faulty_node_reports_each_fault_on_its_own_gpu(library_dir: Path) -> None:
    result = gpuwatch(library_dir, SCENARIOS / "faulty-node.txt", "status", "--json")
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert [gpu["error"] for gpu in gpus] == [None, None, "GPU is lost", None]
    assert gpus[1]["power_w"] is None and gpus[1]["power_limit_w"] == 400.0
    assert gpus[3]["name"] == "Tesla V100-SXM2-32GB" and gpus[3]["utilization_pct"] == 64


def test_driver_not_loaded_is_exit_code_3(library_dir: Path, tmp_path: Path) -> None:
    result = gpuwatch(library_dir, tmp_path / "missing.txt", "status")
    assert result.returncode == 3
    assert result.stderr.splitlines()[-1].startswith("gpuwatch: error: NVIDIA driver not loaded")


def test_call_budget_over_the_real_bindings(library_dir: Path, tmp_path: Path) -> None:
    scenario = SCENARIOS / "node-8gpu.txt"
    one_shot, watched = tmp_path / "one.stats", tmp_path / "watch.stats"
    gpuwatch(library_dir, scenario, "status", "--json", stats=one_shot)
    gpuwatch(
        library_dir, scenario, "status", "--json", "--watch", "0.05", "--count", "11", stats=watched
    )
    assert total_calls(one_shot) <= 17 * 8 + 5, "gpustat makes 124, without MPS or SM use"
    further_per_gpu = (total_calls(watched) - total_calls(one_shot)) / 10 / 8
    assert further_per_gpu <= 11


@pytest.mark.parametrize(
    "scenario", [SCENARIOS / "node-8gpu.txt", SCENARIOS / "mig-a100.txt"], ids=["8-gpu", "mig"]
)
def test_each_process_has_the_sm_utilization_the_driver_samples(
    library_dir: Path, scenario: Path
) -> None:
    # GIVEN a scenario whose proc records carry sm= (or none: the driver then has no sample)
    result = gpuwatch(library_dir, scenario, "status", "--json", "--backend", "nvml")
    assert result.returncode == 0, result.stderr
    shown = {p["pid"]: p["sm_util_pct"] for p in json.loads(result.stdout)["processes"]}
    # THEN each process shows its sample, 0 without one, and None inside a MIG device
    # (where the driver samples no process)
    expected = {
        int(proc["pid"]): None if "mig" in proc else int(proc.get("sm", 0))
        for proc in records(scenario, "proc")
    }
    assert shown == expected


def test_a_gpu_that_samples_no_process_is_not_asked_again(
    library_dir: Path, tmp_path: Path
) -> None:
    # GIVEN the MIG node: GPU 0 in MIG mode (NOT_SUPPORTED), GPU 1 without MIG
    stats = tmp_path / "calls.stats"
    result = gpuwatch(
        library_dir,
        SCENARIOS / "mig-a100.txt",
        "status",
        "--json",
        "--backend",
        "nvml",
        "--watch",
        "0.05",
        "--count",
        "5",
        stats=stats,
    )
    assert result.returncode == 0, result.stderr
    calls = dict(line.split()[:2] for line in stats.read_text().splitlines())
    # THEN GPU 1 is asked once per sample, GPU 0 only the first time
    assert int(calls["nvmlDeviceGetProcessUtilization"]) == 5 + 1
