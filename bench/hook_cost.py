"""What `gpuwatch.torch.watch()` costs a training step.

- Always on: microseconds per `step()` with the simulated allocator (the watch's own work:
  one read of the counters, the hand-over to the sender; publishing runs meanwhile).
- Per module, every 10 steps: a small MLP on the CPU, watched, against its bare twin, trained
  in turn ten steps each; the ratio of each watched ten to the bare ten beside it holds the
  sampled step and whatever it leaves to the steps after it. Reported as the median over
  cycle pairs, then the median (and range) over repeats, in CPU time of the training thread
  (other processes on a shared machine do not count) and in wall time.
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
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Paired:
    """Per-module cost: the ratio of a watched cycle of `every` steps to a bare one."""

    cpu_ratios: list[float]  # one per repeat: the median over its cycle pairs
    wall_ratios: list[float]
    bare_cpu_ms: float  # mean step, CPU time, across every bare cycle

    def line(self, label: str) -> str:
        cpu, wall = statistics.median(self.cpu_ratios), statistics.median(self.wall_ratios)
        return (
            f"{label}: x{cpu:.3f} CPU time (repeats {_spread(self.cpu_ratios)}), "
            f"x{wall:.3f} wall time (repeats {_spread(self.wall_ratios)}); "
            f"bare step {self.bare_cpu_ms:.3f} ms CPU"
        )


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def _cycle(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, steps: int
) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `steps` training steps."""
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.thread_time() - cpu, time.perf_counter() - wall


def per_module_paired(every: int, repeats: int, pairs: int) -> Paired:
    """Two identical MLPs, one watched per module every `every` steps, trained in turn one
    cycle of `every` steps each: a cycle holds one sampled step and the steps after it, so
    the ratio of a watched cycle to the bare cycle beside it is the whole cost, and load from
    other processes, which comes and goes over seconds, falls on both alike. The median over
    cycle pairs sets aside the pairs a burst of load hit unevenly."""
    torch.set_num_threads(1)
    batch = torch.randn(64, 256)
    bare, hooked = mlp(256, "cpu"), mlp(256, "cpu")
    hooked.load_state_dict(bare.state_dict())
    bare_opt = torch.optim.SGD(bare.parameters(), lr=1e-3)
    hooked_opt = torch.optim.SGD(hooked.parameters(), lr=1e-3)
    for model, optimizer in ((bare, bare_opt), (hooked, hooked_opt)):
        _cycle(model, optimizer, batch, 20)  # warm-up
    cpu_ratios, wall_ratios, bare_cpu = [], [], []
    for _ in range(repeats):
        cpu, wall = [], []
        with watch(hooked, optimizer=hooked_opt, per_module=True, every=every) as memory:
            _cycle(hooked, hooked_opt, batch, every)  # the watch's first cycle starts sampled
            for _ in range(pairs):
                bare_s = _cycle(bare, bare_opt, batch, every)
                hooked_s = _cycle(hooked, hooked_opt, batch, every)
                cpu.append(hooked_s[0] / bare_s[0])
                wall.append(hooked_s[1] / bare_s[1])
                bare_cpu.append(bare_s[0] / every)
            assert memory.modules_step is not None, "the watch measured no module"
        cpu_ratios.append(statistics.median(cpu))
        wall_ratios.append(statistics.median(wall))
    return Paired(cpu_ratios, wall_ratios, statistics.fmean(bare_cpu) * 1e3)


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
    repeats, pairs = (3, 30) if QUICK else (7, 60)
    print(f"per module, CPU MLP: {repeats} repeats of {pairs} interleaved cycle pairs")
    print(per_module_paired(10, repeats, pairs).line("  every 10 steps (target <= 1.05)"))
    print(per_module_paired(1, repeats, pairs * 5).line("  every step (the sampled step alone)"))
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
