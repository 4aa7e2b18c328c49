"""What the fleet screen itself costs at 1,000, 3,000 and 10,000 nodes, without any read:
`FleetApp` headless (160x48), fed prebuilt fleets as its reader would post them.

The fleets are `fleet_screen_feed.rules_fleets`: per-node figures, as a fleet of gpuwatch
daemons reads through Prometheus, a fifth of the nodes changing figures each read and
every node's age moving. For each size:

- CPU: the share of one core the process takes while fed a read every 2 s (the default
  refresh), over `--feeds` reads;
- first frame: from the app's start, handed its first read as `gpuwatch fleet` hands it,
  until the rows are on screen;
- filter: a node's name typed in the filter field (the pilot waits for the screen after
  each key), then Enter, until that node alone is shown, then Esc, until every node is back;
  then `/ z Backspace Esc`: a letter no node matches typed and taken back (where the filter
  applies as it is typed, every node goes and comes back);
- sort: `s` (the next column) and `r` (reversed), each until drawn;
- scroll: PageDown and End, each until drawn.

Each key's figure is wall time from the key until the screen is idle again, the median of
`--tries`.

Run: python bench/fleet_screen_scale.py [--nodes 1000,3000,10000] [--feeds 10] [--tries 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from fleet_screen_feed import INTERVAL_S, Prebuilt, rules_fleets
from textual.pilot import Pilot

from gpuwatch.fleet_model import FleetState
from gpuwatch.tui.fleet.app import FleetApp

SIZE = (160, 48)


async def timed(pilot: Pilot[int], action: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await action()
    await pilot.pause()
    return time.perf_counter() - start


async def cpu_share(
    app: FleetApp, pilot: Pilot[int], fleets: list[FleetState], feeds: int
) -> float:
    """The share of a core the whole process takes while fed a read every 2 s."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(feeds):
        app.feed(fleets[(i + 1) % len(fleets)])
        await pilot.pause(max(0.0, wall + (i + 1) * INTERVAL_S - time.perf_counter()))
    return (time.process_time() - cpu) / (time.perf_counter() - wall) * 100


async def keys(app: FleetApp, pilot: Pilot[int], word: str, tries: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    table = app.table()
    total = table.row_count
    for _ in range(tries):
        for name, pressed in (
            ("filter typed", ("slash", *word)),
            ("Enter (filter applied)", ("enter",)),
            ("Esc (every node back)", ("escape",)),
            ("/ z Backspace Esc", ("slash", "z", "backspace", "escape")),
            ("sort s", ("s",)),
            ("sort r", ("r",)),
            ("scroll PageDown", ("pagedown",)),
            ("scroll End", ("end",)),
            ("scroll Home", ("home",)),
        ):
            seconds = await timed(pilot, lambda p=pressed: pilot.press(*p))
            results.setdefault(name, []).append(seconds)
            if name.startswith("Enter"):
                assert table.row_count == 1, table.row_count
            elif name.startswith("Esc"):
                assert table.row_count == total, table.row_count
    return results


async def measure(nodes: int, feeds: int, tries: int) -> None:
    fleets = rules_fleets(nodes)
    start = time.perf_counter()
    app = FleetApp(Prebuilt(fleets), sample=False, first=fleets[0])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        first = time.perf_counter() - start
        assert app.table().row_count == nodes, app.table().row_count
        cpu = await cpu_share(app, pilot, fleets, feeds)
        word = fleets[0].nodes[nodes // 2].name
        results = await keys(app, pilot, word, tries)
    print(f"{nodes:>6,} nodes  CPU {cpu:5.1f} % of a core at {INTERVAL_S:g} s", flush=True)
    print(f"{'':14}first frame {first:6.2f} s", flush=True)
    for name, seconds in results.items():
        print(f"{'':14}{name:<22} {statistics.median(seconds):6.3f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,3000,10000")
    parser.add_argument("--feeds", type=int, default=10)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    print(f"gpuwatch fleet, headless {SIZE[0]}x{SIZE[1]}, prebuilt reads (no network):")
    for nodes in (int(n) for n in args.nodes.split(",")):
        asyncio.run(measure(nodes, args.feeds, args.tries))


if __name__ == "__main__":
    main()
