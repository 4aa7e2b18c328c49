"""The examples run, on the CPU, with tiny data (as CI runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(*argv: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_train_select_trains_on_the_device_gpuwatch_gives() -> None:
    out = run(
        sys.executable,
        str(EXAMPLES / "train_select.py"),
        "--steps",
        "30",
        env={"GPUWATCH_SIM": "2"},
    )
    assert out.startswith("device=cpu steps=30 loss=")  # a CPU build of torch
    assert float(out.rsplit("=", 1)[1]) < 5


def test_ddp_runs_over_the_gpus_pick_chose() -> None:
    out = run(
        sys.executable,
        "-m",
        "gpuwatch",
        "pick",
        "--sim",
        "4",
        "-n",
        "2",
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLES / "train_ddp.py"),
        "--steps",
        "5",
    )
    line = next(line for line in out.splitlines() if line.startswith("world="))
    assert line.startswith("world=2 device=cpu CUDA_VISIBLE_DEVICES=GPU-")
    assert line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0].count("GPU-") == 2


def test_dataparallel_checkpoint_loads_on_cpu(tmp_path: Path) -> None:
    out = run(
        sys.executable,
        str(EXAMPLES / "dataparallel_checkpoint.py"),
        str(tmp_path / "checkpoint.pt"),
    )
    assert "outputs match=True" in out
