"""What `gpuwatch.torch.watch()` costs a training step.

- Always on: microseconds per `step()` with the simulated allocator (the watch's own work:
  one read of the counters, the hand-over to the sender; publishing runs meanwhile).
- Per module, every 10 steps: a small MLP on the CPU, mean step time with the watch over the
  same without it, sampled steps included (their cost spread over the ten). CPU time of the
  training thread is measured, not wall time, so other processes on a shared machine do not
  count; rounds of each are interleaved so what noise remains hits both alike.
- On a GPU (only where torch sees CUDA): a larger model's step time with the always-on watch
  over the same without it.

Run: python bench/hook_cost.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

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


def per_module_ratio(every: int) -> tuple[float, float, float]:
    torch.set_num_threads(1)
    model = mlp(256, "cpu")
    batch = torch.randn(64, 256)
    return overhead_ratio(
        model,
        batch,
        lambda m, o: watch(m, optimizer=o, per_module=True, every=every),
        rounds=4 if QUICK else 20,
        steps=100 if QUICK else 200,
    )


def gpu_ratio() -> tuple[float, float, float] | None:
    if torch.version.cuda is None or not torch.cuda.is_available():
        return None
    model = mlp(4096, "cuda")
    batch = torch.randn(512, 4096, device="cuda")
    return overhead_ratio(
        model, batch, lambda m, o: watch(m, optimizer=o), rounds=5, steps=100 if QUICK else 300
    )


def main() -> None:
    os.environ.setdefault("GPUWATCH_LEASE_DIR", tempfile.mkdtemp(prefix="gpuwatch-bench-"))
    print(f"torch {torch.__version__}, {'quick' if QUICK else 'full'} run")
    per_step = always_on_us_per_step(50_000 if QUICK else 200_000)
    print(f"always-on, simulated allocator: {per_step:.2f} us per step (target <= 10 us)")
    without, with_, ratio = per_module_ratio(10)
    print(
        f"per-module every 10 steps, CPU MLP: {without * 1e3:.3f} ms -> {with_ * 1e3:.3f} ms "
        f"mean step (CPU time), x{ratio:.3f} (target <= 1.05)"
    )
    without, with_, ratio = per_module_ratio(1)
    print(
        f"  (a sampled step itself: {without * 1e3:.3f} ms -> {with_ * 1e3:.3f} ms, "
        f"x{ratio:.3f}; spread over 10 steps that is x{1 + (ratio - 1) / 10:.3f})"
    )
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
