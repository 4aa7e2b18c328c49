"""The examples run, on the CPU, with tiny data (as CI runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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
        env={"GPUWATCH_SIM": "4"},  # GPU 3 of the simulated node is idle
    )
    assert out.startswith("device=cpu steps=30 loss=")  # a CPU build of torch
    assert float(out.rsplit("=", 1)[1]) < 5


TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


# The example used to abort one rank in about one run in four, depending on timing: one
# run proves little, so it runs several times (and the check below is deterministic).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("attempt", [1, 2, 3], ids=["run-1", "run-2", "run-3"])
def test_ddp_runs_over_the_gpus_pick_chose(attempt: int) -> None:
    # GIVEN the two idle GPUs of eight picked, WHEN torchrun starts two ranks on them
    out = run(
        *(sys.executable, "-m", "gpuwatch", "pick", "--sim", "8", "-n", "2", "--"),
        *TORCHRUN,
        *(str(EXAMPLES / "train_ddp.py"), "--steps", "5"),
    )
    # THEN both ranks train and exit cleanly, on the two GPUs pick chose
    line = next(line for line in out.splitlines() if line.startswith("world="))
    assert line.startswith("world=2 device=cpu CUDA_VISIBLE_DEVICES=GPU-")
    assert line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0].count("GPU-") == 2


THREADS_AFTER_MAIN = """
import os, runpy, sys
sys.argv = [sys.argv[1], "--steps", "3"]
runpy.run_path(sys.argv[0], run_name="__main__")
# One write of the whole line: both ranks share the pipe, and print() writes in pieces.
os.write(1, b"threads left: %d\\n" % len(os.listdir("/proc/self/task")))
"""


@pytest.mark.timeout(300)
def test_ddp_ranks_stop_the_backend_threads_before_python_exits(tmp_path: Path) -> None:
    # A gloo thread still alive when Python exits may abort the rank as it frees its last
    # work item: the example must have stopped them all by the time its main() returns.
    wrapper = tmp_path / "threads_after_main.py"
    wrapper.write_text(THREADS_AFTER_MAIN)
    out = run(*TORCHRUN, str(wrapper), str(EXAMPLES / "train_ddp.py"))
    assert [line for line in out.splitlines() if line.startswith("threads")] == [
        "threads left: 1",
        "threads left: 1",
    ]


def test_dataparallel_checkpoint_loads_on_cpu(tmp_path: Path) -> None:
    out = run(
        sys.executable,
        str(EXAMPLES / "dataparallel_checkpoint.py"),
        str(tmp_path / "checkpoint.pt"),
    )
    assert "outputs match=True" in out
