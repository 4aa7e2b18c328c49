"""What `gpuwatch.torch.watch()` costs a training loop.

- Always on: microseconds per `step()` with the simulated allocator (the watch's own work:
  one read of the counters, the hand-over to the sender; publishing runs meanwhile).
- The user's figure: the wall time of a training (a small MLP on the CPU, one torch thread)
  with a whole watch, its background threads included, against the same training without
  one; also per module, every 10 steps. Each run is its own process, the kinds alternated
  (A B C A B C ...), and the medians compared; the CPU time of all the process's threads is
  shown beside, as what the watch takes from other work on a busy machine.
- On a GPU (only where torch sees CUDA): a larger model's step time with the always-on watch
  over the same without it.

Run: python bench/hook_cost.py [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gpuwatch.torch import SimulatedAllocator, watch

QUICK = "--quick" in sys.argv


def always_on_us_per_step(steps: int = 200_000) -> float:
    sim = SimulatedAllocator()
    sim.allocate(300 << 20)
    sim.allocate(1 << 10)
    runs = []
    for _ in range(5):
        with watch(source=sim) as memory:
            start = time.perf_counter()
            for _ in range(steps):
                memory.step()
            runs.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(runs)


def mlp(width: int, device: str) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width), nn.ReLU(inplace=True), nn.Linear(width, width),
        nn.ReLU(inplace=True), nn.Linear(width, 10),
    ).to(device)  # fmt: skip


def step_times(
    model: nn.Module, batch: torch.Tensor, steps: int, watched: Callable[..., object] | None
) -> list[float]:
    """Seconds per step over `steps` steps, optionally under a watch made by `watched`."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if batch.is_cuda else (lambda: None)
    clock = time.perf_counter if batch.is_cuda else time.thread_time  # GPU waits are not CPU
    memory = watched(model, optimizer) if watched else None
    times = []
    try:
        for _ in range(steps):
            start = clock()
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(clock() - start)
    finally:
        if memory is not None:
            memory.close()  # type: ignore[attr-defined]
    return times


def overhead_ratio(
    model: nn.Module, batch: torch.Tensor, watched: Callable[..., object], rounds: int, steps: int
) -> tuple[float, float, float]:
    """(mean step without, mean step with, ratio), interleaving rounds of each."""
    step_times(model, batch, 20, None)  # warm-up
    bare: list[float] = []
    hooked: list[float] = []
    for _ in range(rounds):
        bare += step_times(model, batch, steps, None)
        hooked += step_times(model, batch, steps, watched)
    without, with_ = statistics.fmean(bare), statistics.fmean(hooked)
    return without, with_, with_ / without


MODES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "watch": {},
    "watch per_module every=10": {"per_module": True, "every": 10},
}
"""What each training process runs under: no watch, or `watch()` with these options."""


def train_once(mode: str, steps: int) -> dict[str, float]:
    """One training run in this process (the child's side): `steps` steps of a CPU MLP under
    `mode`, the watch started and closed inside the timed span, its threads running."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, batch = mlp(256, "cpu"), torch.randn(64, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(20):  # warm-up, outside the timed span
        _train_step(model, optimizer, batch)
    options = MODES[mode]
    wall, cpu = time.perf_counter(), time.process_time()  # process time: every thread
    memory = watch(model, optimizer=optimizer, **options) if options is not None else None
    for _ in range(steps):
        _train_step(model, optimizer, batch)
    if memory is not None:
        memory.close()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    model(batch).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def whole_watch_cost(rounds: int, steps: int) -> dict[str, list[dict[str, float]]]:
    """Each mode in its own process, the modes alternated (A B C A B C ..., the order turned
    each round, so none always runs first): load from other users falls on all alike."""
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    names = list(MODES)
    for round_ in range(rounds):
        for mode in names[round_ % len(names) :] + names[: round_ % len(names)]:
            child = subprocess.run(
                [sys.executable, __file__, "--child", mode, str(steps)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[mode].append(json.loads(child.stdout.splitlines()[-1]))
    return runs


def print_whole_watch_cost(runs: dict[str, list[dict[str, float]]], steps: int) -> None:
    """Per kind: the median run, its ratio to the median bare run, and the median of the
    ratios of each run to the bare run of its own round (which sets aside a round that a
    burst of load hit)."""
    bare = runs["none"]
    for mode, results in runs.items():
        line = []
        for clock, label in (("wall_s", "wall"), ("cpu_s", "CPU of all threads")):
            median = statistics.median(run[clock] for run in results)
            of_medians = median / statistics.median(run[clock] for run in bare)
            paired = statistics.median(
                r[clock] / b[clock] for r, b in zip(results, bare, strict=True)
            )
            line.append(f"{label} {median * 1e3:7.1f} ms (x{of_medians:.3f}; paired x{paired:.3f})")
        wall_per_step = statistics.median(run["wall_s"] for run in results) / steps
        print(f"  {mode:<26} " + ", ".join(line) + f"; {wall_per_step * 1e3:.3f} ms per step")


def gpu_ratio() -> tuple[float, float, float] | None:
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    model = mlp(4096, "cuda")
    batch = torch.randn(512, 4096, device="cuda")
    return overhead_ratio(
        model, batch, lambda m, o: watch(m, optimizer=o), rounds=5, steps=100 if QUICK else 300
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(train_once(sys.argv[2], int(sys.argv[3]))))
        return
    os.environ.setdefault("GPUWATCH_LEASE_DIR", tempfile.mkdtemp(prefix="gpuwatch-bench-"))
    print(f"torch {torch.__version__}, {'quick' if QUICK else 'full'} run")
    per_step = always_on_us_per_step(50_000 if QUICK else 200_000)
    print(f"always-on, simulated allocator: {per_step:.2f} us per step (target <= 10 us)")
    rounds, steps = (6, 500) if QUICK else (15, 1500)
    print(
        f"training with a whole watch (its threads included) against none: a CPU MLP, "
        f"{steps} steps per run, each run its own process, {rounds} rounds alternated; medians"
    )
    print_whole_watch_cost(whole_watch_cost(rounds, steps), steps)
    if (gpu := gpu_ratio()) is None:
        print("GPU always-on overhead: not run (torch sees no CUDA device here)")
    else:
        without, with_, ratio = gpu
        print(
            f"GPU always-on, MLP 4096 wide: {without * 1e3:.3f} ms -> {with_ * 1e3:.3f} ms "
            f"mean step, overhead {(ratio - 1) * 100:+.2f}% (target <= 1%)"
        )


if __name__ == "__main__":
    main()
