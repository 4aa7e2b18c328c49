"""NVML calls per look at an 8-GPU node with 40 processes, counted by the driver's stand-in.

1. Through the real pynvml over ../shared/fakenvml (FAKENVML_STATS): a one-shot status, each
   further --watch sample, and one selection (what pick and select() read), beside gpustat,
   nvitop and nvisel when they are installed.
2. On fakenvml's MIG node (mig-a100.txt: one A100 with 3 MIG devices, one
   without MIG), gpuwatch beside nvitop -1, which also shows MIG devices.

Run: python bench/nvml_calls.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from _common import FAKENVML, build_fakenvml, fakenvml_env, tool, total_calls

WATCH_SAMPLES = 11
MIG_A100 = FAKENVML / "scenarios" / "mig-a100.txt"
ONE_SELECTION = (
    "from gpuwatch.backends.base import SampleScope\n"
    "from gpuwatch.backends.nvml import NvmlBackend\n"
    "with NvmlBackend() as backend:\n"
    "    backend.sample(SampleScope.SELECTION)\n"
)


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
        "one selection (open, sample, close)": [sys.executable, "-c", ONE_SELECTION],
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
    through_fakenvml()
