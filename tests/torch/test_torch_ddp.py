"""Under DDP (gloo, 2 ranks on the CPU) each rank publishes its own report, with rank and size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

RANK_SCRIPT = """
import torch, torch.distributed as dist
from torch import nn
import gpuwatch.torch
from gpuwatch.reports.training import read_reports

dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
with gpuwatch.torch.watch(model, optimizer=optimizer, per_module=True) as memory:
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    memory.publish_now()
    dist.barrier()  # every rank has published
    if dist.get_rank() == 0:
        found = read_reports().reports
        print("reports", sorted((r.rank, r.world_size, r.step) for r in found))
        print("modules", sorted({m.name for r in found for m in r.modules}))
    dist.barrier()  # rank 0 has read before anyone closes
dist.destroy_process_group()
"""


def torchrun(*argv: str, lease_dir: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GPUWATCH_LEASE_DIR": str(lease_dir)},
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_each_ddp_rank_publishes_its_own_report(tmp_path: Path, lease_dir: Path) -> None:
    # GIVEN two gloo ranks, each watching its DDP-wrapped model
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    # WHEN they train three steps
    out = torchrun(str(script), lease_dir=lease_dir)
    # THEN rank 0 reads one report per rank, each with its rank, the world size and its steps
    assert "reports [(0, 2, 3), (1, 2, 3)]" in out
    # per-module figures under DDP, named once, as without the wrapper: no `module.` prefix
    assert "modules ['0 (Linear)', '1 (ReLU)', 'Sequential']" in out


def test_the_example_trains_watched_on_two_ranks(lease_dir: Path) -> None:
    out = torchrun(str(EXAMPLES / "watch_training.py"), "--steps", "12", lease_dir=lease_dir)
    assert "rank=0/2 device=cpu steps=12" in out
    assert "rank=1/2 device=cpu steps=12" in out


def test_the_example_trains_watched_in_one_process(tmp_path: Path, lease_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "watch_training.py"), "--steps", "15"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GPUWATCH_SIM": "4"},  # GPU 3 of four is idle
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("rank=0/1 device=cpu steps=15 largest modules: Sequential")
    assert result.stderr.count("CPU build") == 1
