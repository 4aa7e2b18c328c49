"""Where the CPU of the fleet table's refresh goes, at 1,000, 3,000 and 10,000 nodes: the
table's `PrometheusSource` read every 2 s (the screen's default refresh) against the
stand-in (bench/prom_standin.py: 89 % gpuwatch daemons, 10 % dcgm-exporter and
nvidia_gpu_exporter, 1 % down; each scraped every 15 s, so that a read finds an eighth
of them scraped since), in this process, without the screen.

For each size it prints the reading thread's CPU a refresh (the answers' transfer runs in
threads of its own, not counted), the median of `--reads` after three unmeasured ones, and
the parts of it, each the CPU of one step of the read:

- ask: the round's queries sent and their answers filed by target, of which decode: the
  JSON answers decoded into samples;
- keep: the table's memory filing the answers and what it holds (`TableMemory.keep`);
- older: which daemons are too old for the round's queries;
- nodes: a node per target (`prom_nodes.nodes_of`), of which build: the nodes built again
  from their series, inputs: what each was compared on;
- claimed: the nodes sorted, each told how many claim its name.

Then the screen's own work on the read, apart: its watch of idle GPUs and the table's rows
made (`IdleTracker.observe`, `build_rows`, the rows of nodes not scraped since kept).

Run: python bench/fleet_read_parts.py [--nodes 1000,3000,10000] [--reads 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _fleet import serving

from gpuwatch.fleet import prom_nodes, prometheus
from gpuwatch.fleet.promapi import PromClient
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet.table_memory import TableMemory
from gpuwatch.fleet_model import FleetState
from gpuwatch.tui.common.app import DEFAULT_IDLE_AFTER_S
from gpuwatch.tui.fleet.rows import IdleTracker, RowMemory, build_rows

STANDIN = Path(__file__).resolve().with_name("prom_standin.py")
INTERVAL_S = 2.0


class Parts:
    """The CPU of each step timed, summed over a read."""

    def __init__(self) -> None:
        self.cpu_s: dict[str, float] = {}

    def timed(self, owner: Any, name: str, label: str) -> None:
        """Wraps `owner.name` (a module's function or a class's method) to count its CPU."""
        step: Callable[..., Any] = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return step(*args, **kwargs)
            finally:
                self.cpu_s[label] = self.cpu_s.get(label, 0.0) + time.thread_time() - start

        setattr(owner, name, counted)


def measure(url: str, reads: int, parts: Parts) -> str:
    source = PrometheusSource(url, needs=Needs(per_node=True))
    idle, memory = IdleTracker(), RowMemory()

    def rows(fleet: FleetState) -> None:
        idle.observe(fleet, time.monotonic())
        build_rows(fleet, idle.idle_for, DEFAULT_IDLE_AFTER_S, memory)

    for _ in range(3):
        rows(source.read())
        time.sleep(INTERVAL_S)
    totals: list[float] = []
    each: dict[str, list[float]] = {}
    screen: list[float] = []
    for _ in range(reads):
        parts.cpu_s.clear()
        wall, cpu = time.perf_counter(), time.thread_time()
        fleet = source.read()
        totals.append(time.thread_time() - cpu)
        cpu = time.thread_time()
        rows(fleet)
        screen.append(time.thread_time() - cpu)
        for label, spent in parts.cpu_s.items():
            each.setdefault(label, []).append(spent)
        time.sleep(max(0.0, wall + INTERVAL_S - time.perf_counter()))
    shown = ", ".join(f"{label} {statistics.median(s) * 1000:.0f}" for label, s in each.items())
    return (
        f"a refresh: {statistics.median(totals) * 1000:.0f} ms of CPU ({shown}); "
        f"then its rows: {statistics.median(screen) * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,3000,10000")
    parser.add_argument("--reads", type=int, default=10)
    args = parser.parse_args()
    parts = Parts()
    parts.timed(prometheus, "ask", "ask")
    parts.timed(PromClient, "_named", "decode")
    parts.timed(TableMemory, "keep", "keep")
    parts.timed(PrometheusSource, "_older_daemons", "older")
    parts.timed(prometheus, "nodes_of", "nodes")
    parts.timed(prom_nodes, "_node", "build")
    parts.timed(prom_nodes, "_inputs", "inputs")
    parts.timed(prometheus, "claimed", "claimed")
    for nodes in (int(n) for n in args.nodes.split(",")):
        with serving([sys.executable, str(STANDIN), "--nodes", str(nodes)]) as ready:
            print(f"{nodes} nodes: {measure(str(ready['url']), args.reads, parts)}", flush=True)


if __name__ == "__main__":
    main()
