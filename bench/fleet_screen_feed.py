"""What the fleet screen itself costs per refresh, without any read: `FleetApp` headless, fed
prebuilt fleets of 500 nodes x 8 GPUs as its reader would post them every 2 s.

Two kinds of fleet: `gpus`, every GPU of every node (as read GPU by GPU, from the simulated
fleet: values move on every node), and `rules`, per-node figures as recording rules give
them (values move on a fifth of the nodes per read). In both, every node's age moves each
read, as a Prometheus scraping every 15 s makes it. For each kind and terminal size: the
median CPU time of the process from a feed until the screen is drawn and quiet, the same
span's CPU with no feed (the screen idle), and the share of one core at a 2 s refresh.

Run: python bench/fleet_screen_feed.py [--baseline-python /path/to/venv/bin/python]
                                       [--feeds 30] [--nodes 500] [--profile gpus|rules]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import statistics
import subprocess
import time

import msgspec

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.fleet_model import FleetState, NodeState, NodeSummary
from gpuwatch.tui.fleet.app import FleetApp
from gpuwatch.tui.fleet.rows import node_row

START = 1_700_000_000.0
INTERVAL_S = 2.0
SETTLE_S = 0.15
"""How long the screen is left after a feed to draw (Textual draws on its own timer)."""
SCRAPE_S = 15.0
DISTINCT = 8
"""Distinct fleets fed in turn."""
SIZES = ((200, 50), (80, 24))


def gpu_fleets(nodes: int) -> list[FleetState]:
    """Every GPU of every node; a node's figures change only when it is scraped (every
    15 s, each node at its own moment), as a Prometheus source reads them."""
    clock = [START]
    sim = SimFleet(nodes, clock=lambda: clock[0])
    fleets: list[FleetState] = []
    for i in range(DISTINCT):
        clock[0] = START + INTERVAL_S * i
        fresh = sim.read()
        if fleets:
            fresh = msgspec.structs.replace(fresh, nodes=tuple(
                new if _scraped(k, i) else msgspec.structs.replace(new, snapshot=old.snapshot)
                for k, (old, new) in enumerate(zip(fleets[-1].nodes, fresh.nodes, strict=True))
            ))  # fmt: skip
        fleets.append(_aged(fresh, i))
    return fleets


def _scraped(k: int, i: int) -> bool:
    """Whether node `k` was scraped between read `i - 1` and read `i`."""
    return int((INTERVAL_S * i + k * 1.7) / SCRAPE_S) != int(
        (INTERVAL_S * (i - 1) + k * 1.7) / SCRAPE_S
    )


def rules_fleets(nodes: int) -> list[FleetState]:
    """Per-node summaries; a fifth of the nodes change figures each read."""
    base = SimFleet(nodes, clock=lambda: START).read()
    rng = random.Random(0)
    summaries = [_summary(node) for node in base.nodes]
    states = [
        msgspec.structs.replace(n, snapshot=None, summary=s)
        for n, s in zip(base.nodes, summaries, strict=True)
    ]
    fleets = []
    for i in range(DISTINCT):
        for k, state in enumerate(states):
            if state.summary is not None and rng.random() < 0.2:
                util = rng.uniform(0, 100)
                summary = msgspec.structs.replace(
                    state.summary, utilization_pct=util, power_w=70 + 6 * util
                )
                states[k] = msgspec.structs.replace(state, summary=summary)
        fleets.append(_aged(FleetState(START + INTERVAL_S * i, base.source, tuple(states)), i))
    return fleets


def _summary(node: NodeState) -> NodeSummary | None:
    if node.snapshot is None:
        return None
    row = node_row(node, None, 600.0)
    return NodeSummary(
        row.gpus, row.gpus_free, row.most_free_bytes, row.memory_free_bytes,
        row.utilization_pct, row.hottest_c, row.power_w, row.leases, row.idle_held,
        tuple((user, 1, 1 << 30) for user in sorted(row.users)), tuple(row.models.split()),
    )  # fmt: skip


def _aged(fleet: FleetState, i: int) -> FleetState:
    """Each up node's data as old as its scrape phase makes it at read `i`."""
    nodes = tuple(
        node
        if not node.up
        else msgspec.structs.replace(
            node, data_at=fleet.taken_at - ((INTERVAL_S * i + k * 1.7) % SCRAPE_S + 0.2)
        )
        for k, node in enumerate(fleet.nodes)
    )
    return msgspec.structs.replace(fleet, nodes=nodes)


class Prebuilt:
    description = "prebuilt"

    def __init__(self, fleets: list[FleetState]) -> None:
        self.fleets = fleets

    def read(self) -> FleetState:
        return self.fleets[0]

    def close(self) -> None:
        pass


async def measure(
    fleets: list[FleetState], size: tuple[int, int], feeds: int, profile: cProfile.Profile | None
) -> tuple[float, float]:
    now = [1000.0]
    app = FleetApp(Prebuilt(fleets), sample=False, monotonic=lambda: now[0])
    async with app.run_test(size=size) as pilot:
        for i in range(4):  # warm: first rows, caches
            app.feed(fleets[i % len(fleets)])
            await pilot.pause(SETTLE_S)
        fed, idle = [], []
        for i in range(feeds):
            now[0] += INTERVAL_S
            start = time.process_time()
            if profile:
                profile.enable()
            app.feed(fleets[(i + 4) % len(fleets)])
            await pilot.pause(SETTLE_S)
            if profile:
                profile.disable()
            fed.append(time.process_time() - start)
            start = time.process_time()
            await pilot.pause(SETTLE_S)
            idle.append(time.process_time() - start)
    return statistics.median(fed), statistics.median(idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-python", help="another checkout's virtualenv python")
    parser.add_argument("--feeds", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--profile", choices=("gpus", "rules"), help="cProfile one kind (200x50)")
    parser.add_argument("--label", default="this")
    args = parser.parse_args()
    if args.baseline_python:
        command = [
            args.baseline_python,
            __file__,
            "--feeds",
            str(args.feeds),
            "--nodes",
            str(args.nodes),
            "--label",
            "before",
        ]
        subprocess.run(command, check=True)
    makers = {"gpus": gpu_fleets, "rules": rules_fleets}
    if args.profile:
        profile = cProfile.Profile()
        asyncio.run(measure(makers[args.profile](args.nodes), SIZES[0], args.feeds, profile))
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    for kind, make in makers.items():
        fleets = make(args.nodes)
        for size in SIZES:
            fed, idle = asyncio.run(measure(fleets, size, args.feeds, None))
            cost = fed - idle
            print(
                f"{args.label:6} {kind:5} {size[0]:3}x{size[1]:<2}"
                f"  per feed {fed * 1000:6.1f} ms CPU"
                f"  idle span {idle * 1000:5.1f} ms  feed cost {cost * 1000:6.1f} ms"
                f" = {cost / INTERVAL_S * 100:4.1f} % of a core at {INTERVAL_S:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
