"""NVML calls per look at an 8-GPU node with 40 processes, counted two ways.

1. Through the fake pynvml of the test suite (no C library needed).
2. Through the real pynvml over ../shared/fakenvml (FAKENVML_STATS), beside
   gpustat, nvitop and nvisel when they are installed.
3. On fakenvml's MIG node (mig-a100.txt: one A100 with 3 MIG devices, one
   without MIG), gpuwatch beside nvitop -1, which also shows MIG devices.

Run: python bench/nvml_calls.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _common import FAKENVML, REPO, build_fakenvml, fakenvml_env, tool, total_calls

sys.path.insert(0, str(REPO))
from gpuwatch.backends.base import SampleScope
from gpuwatch.backends.nvml import NvmlBackend
from tests.helpers.fake_nvml import eight_gpu_node

WATCH_SAMPLES = 11
MIG_A100 = FAKENVML / "scenarios" / "mig-a100.txt"


def through_fake_module() -> None:
    with pytest.MonkeyPatch.context() as patch:
        fake = eight_gpu_node().install(patch)
        with NvmlBackend() as backend:
            backend.sample()
        one_shot = fake.total_calls
        fake.calls.clear()
        with NvmlBackend() as backend:
            backend.sample()
            fake.calls.clear()
            backend.sample()
            further = fake.total_calls
        fake.calls.clear()
        with NvmlBackend() as backend:
            backend.sample(SampleScope.SELECTION)
        selection = fake.total_calls
    print("fake pynvml module, 8 GPUs / 40 processes:")
    print(f"  one-shot full sample (status --json)   {one_shot:4d} calls")
    print(f"  each further sample (--watch)          {further / 8:6.1f} per GPU")
    print(f"  one selection (open, sample, close)    {selection:4d} calls  (4 per GPU + 3 = 35)")


def through_fakenvml() -> None:
    if not (FAKENVML / "Makefile").is_file():
        print(f"(skipped fakenvml: {FAKENVML} not found)")
        return
    library = build_fakenvml()
    work = Path(tempfile.mkdtemp())
    gpuwatch = [sys.executable, "-m", "gpuwatch", "status", "--json"]
    runs = {
        "gpuwatch status --json": gpuwatch,
        f"gpuwatch status --json --watch ({WATCH_SAMPLES} samples)": [
            *gpuwatch,
            "--watch",
            "0.05",
            "--count",
            str(WATCH_SAMPLES),
        ],
    }
    for name, argv in (
        ("gpustat --json", ["--json"]),
        ("nvitop -1", ["-1"]),
        ("nvisel -n 2", ["-n", "2"]),
    ):
        path = tool(name.split()[0])
        if path:
            runs[name] = [path, *argv]
    counts = {}
    for number, (name, argv) in enumerate(runs.items()):
        stats = work / f"{number}.stats"
        env = fakenvml_env(library, FAKENVML_STATS=str(stats))
        subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        counts[name] = total_calls(stats)
    print("real pynvml over fakenvml (FAKENVML_STATS), node-8gpu.txt:")
    for name, calls in counts.items():
        print(f"  {name:<44} {calls:4d} calls")
    one_shot, watched = list(counts.values())[:2]
    per_gpu = (watched - one_shot) / (WATCH_SAMPLES - 1) / 8
    print(f"  each further --watch sample: {per_gpu:.1f} calls per GPU")
    through_fakenvml_mig(library, work)


def through_fakenvml_mig(library: Path, work: Path) -> None:
    gpuwatch = [sys.executable, "-m", "gpuwatch", "status", "--json", "--backend", "nvml"]
    runs = {
        "gpuwatch status --json": gpuwatch,
        f"gpuwatch status --json --watch ({WATCH_SAMPLES} samples)": [
            *gpuwatch,
            "--watch",
            "0.05",
            "--count",
            str(WATCH_SAMPLES),
        ],
    }
    if nvitop := tool("nvitop"):
        runs["nvitop -1"] = [nvitop, "-1"]
    print(f"real pynvml over fakenvml (FAKENVML_STATS), {MIG_A100.name}:")
    counts = {}
    for number, (name, argv) in enumerate(runs.items()):
        stats = work / f"mig{number}.stats"
        env = fakenvml_env(library, MIG_A100, FAKENVML_STATS=str(stats))
        subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        counts[name] = total_calls(stats)
        mig = sum(
            int(line.split()[1])
            for line in stats.read_text().splitlines()
            if "Mig" in line or "InstanceId" in line
        )
        print(f"  {name:<44} {counts[name]:4d} calls  ({mig} of them MIG functions)")
    one_shot, watched = list(counts.values())[:2]
    print(f"  each further --watch sample: {(watched - one_shot) / (WATCH_SAMPLES - 1):.1f} calls")


if __name__ == "__main__":
    through_fake_module()
    through_fakenvml()
