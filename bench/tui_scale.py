"""What one keystroke and a mass exit cost `gpuwatch tui` with thousands of processes.

Headless (`App.run_test`), 160x48, one node of 8 GPUs with N processes (default 5,000):

1. time per keystroke: `s` (sort by the next column), `r` (reverse), `down`, a filter
   word that hides every row, and Backspace that brings them all back;
2. time to empty: every process exits at once, from the frame that says so until the
   table has no rows.

Each figure is from the key (or frame) to the screen idle again, the median of a few tries.

Run: python bench/tui_scale.py [--processes N] [--tries K]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from gpuwatch.models import GpuSample, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.tui.common.frames import Frame
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.sources import Source

SIZE = (160, 48)
GIB = 1 << 30
NOW = 1_800_000_000.0


class Quiet(Source):
    label = "bench-node"

    def frames(self, interval_s, stop):  # type: ignore[no-untyped-def]
        stop.wait()
        yield from ()


def frame(processes: int) -> Frame:
    gpus = tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=None,
            memory_total_bytes=80 * GIB,
            memory_used_bytes=40 * GIB,
            memory_free_bytes=40 * GIB,
            utilization_pct=50,
        )
        for i in range(8)
    )
    procs = tuple(
        ProcessUsage(
            pid=10_000 + n,
            gpu_index=n % 8,
            gpu_uuid=f"GPU-{n % 8}",
            memory_used_bytes=(256 + n % 512) << 20,
            kind=ProcessKind.COMPUTE,
            user=f"user{n % 37}",
            command=f"python worker.py --id {n}",
            cpu_pct=float(n % 100),
            rss_bytes=(1 + n % 7) * GIB,
            started_at=NOW - n,
        )
        for n in range(processes)
    )
    return Frame("bench-node", Snapshot(NOW, "bench-node", "580", "13.0", gpus, procs))


async def timed(pilot, action: Callable[[], Awaitable[None]]) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    await action()
    await pilot.pause()
    return time.perf_counter() - start


async def measure(processes: int, tries: int) -> dict[str, list[float]]:
    app = GpuwatchApp([Quiet()], clock=lambda: NOW, sample=False, as_root=False)
    full, empty = frame(processes), frame(0)
    results: dict[str, list[float]] = {}
    async with app.run_test(size=SIZE) as pilot:
        table = app.table()

        def record(name: str, seconds: float) -> None:
            results.setdefault(name, []).append(seconds)

        async def feed(which: Frame) -> None:
            app.feed(0, which)

        for _ in range(tries):
            record("first frame (all rows appear)", await timed(pilot, lambda: feed(full)))
            assert table.row_count == processes, table.row_count
            for key in ("s", "r", "down"):
                record(f"key {key}", await timed(pilot, lambda k=key: pilot.press(k)))
            await pilot.press("slash")
            record("filter key (hides every row)", await timed(pilot, lambda: pilot.press("z")))
            assert table.row_count == 0, table.row_count
            record(
                "Backspace (every row back)", await timed(pilot, lambda: pilot.press("backspace"))
            )
            assert table.row_count == processes, table.row_count
            await pilot.press("escape")
            record("mass exit (table empties)", await timed(pilot, lambda: feed(empty)))
            assert table.row_count == 0, table.row_count
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=5000)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(measure(args.processes, args.tries))
    print(f"gpuwatch tui, {args.processes:,} processes on 8 GPUs, {SIZE[0]}x{SIZE[1]} (headless):")
    for name, seconds in results.items():
        print(f"  {name:<32} median {statistics.median(seconds):7.3f} s  (max {max(seconds):.3f})")


if __name__ == "__main__":
    main()
