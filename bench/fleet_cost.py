"""What reading a fleet costs, against a real Prometheus scraping simulated nodes.

One process (bench/fleet_nodes.py) serves the `/metrics` of up to 1,000 nodes of 8 GPUs,
each on its own loopback port, their readings moving every second, plus 5 nodes that hang
and 5 that refuse; a real Prometheus (Debian's `prometheus`) scrapes them. Then:

(a) the bare client: one PromQL query for free memory (`gpuwatch_memory_free_bytes`) with
    the standard library, `python -c ...`, the same Python as gpuwatch; wall time of the
    whole process, the median of interleaved runs;
(b) `gpuwatch where -n 2 --min-free 40GiB --prometheus URL` beside it, at 500 nodes (it
    reads each node's own verdict, `gpuwatch_memory_available_bytes`), and the same with
    `--max-util 50` (a request at other limits: every family placement reads);
(c) steady refreshes of the fleet (`PrometheusSource.read()`), 2 s apart as the screen
    makes them, at 100, 500 and 1,000 nodes: every GPU's series ("gpus"), and the
    table's per-node figures (each daemon's `gpuwatch_node_*`), with what only
    Prometheus computes evaluated at its turn where no rule records it ("evaluated",
    through a proxy that hides the rules) or recorded by
    examples/gpuwatch-fleet-rules.yml ("recorded"): requests, bytes (as sent, gzip, and
    as JSON) and time, the median refresh and the largest, counted by a proxy in front
    of Prometheus;
(d) direct scraping (`ScrapeSource.read()`) of 100 nodes as a lab mixes them (80 gpuwatch
    daemons, 10 dcgm-exporters and 10 nvidia_gpu_exporters, their recorded output), all
    answering, and with 5 hung and 5 refusing in place of 10 daemons: the wall time with
    gpuwatch's own parser of the text format and with prometheus-client's, runs
    interleaved; beside the per-node timeout, the floor of 100 concurrent standard-library
    GETs, and `gpuwatch where --nodes-file` as a whole process (with `--baseline`, beside
    that environment's);
(e) `gpuwatch fleet --interval 2` at 500 nodes, in a tmux pane: the CPU of the whole
    process in steady state, its figures evaluated (through the proxy that hides the
    rules) and recorded.

Prometheus runs on this machine too, so every figure carries its load.

Run: python bench/fleet_cost.py [--sizes 100,500,1000] [--where-at 500] [--runs 11]
                                [--scrape-interval 5] [--timeout 2] [--cpu-seconds 30]
                                [--baseline VENV] [--parts abcde] [--screen-runs 1]
(`--baseline VENV` times that environment's `gpuwatch where`, and its screen, in the same
runs, for a before-and-after.) Bytecode is written under a temporary PYTHONPYCACHEPREFIX,
as an installed gpuwatch has it, even where PYTHONDONTWRITEBYTECODE is set.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO
from _fleet import (
    BARE_CLIENT,
    CountingProxy,
    Nodes,
    Prometheus,
    gpuwatch_command,
    median_wall_s,
    running_prometheus,
    serving_nodes,
    steady_cpu_pct,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.fleet import scrape
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs

MIB = 1 << 20
RULES = REPO / "examples" / "gpuwatch-fleet-rules.yml"
WHERE = ("where", "-n", "2", "--min-free", "40GiB")
MODES = {
    "gpus": "every GPU's series (fleet --json; a fleet with other exporters)",
    "evaluated": "the fleet table: each daemon's node figures, and what only Prometheus "
    "computes (idle holders, users) evaluated by it, where no rule records it",
    "recorded": "the same, that part recorded by examples/gpuwatch-fleet-rules.yml",
}
OTHER_EXPORTERS = 10
"""dcgm-exporter nodes, and as many nvidia_gpu_exporter nodes, of (d)'s 100."""


def library_parse(text: str, prefixes: tuple[str, ...]) -> Iterator[Sample]:
    """prometheus-client's parser of the text format where gpuwatch's own parses a node's
    answer: the samples of the families the fleet reads, finite values only."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefixes) and math.isfinite(sample.value):
                yield Sample(sample.name, sample.labels, sample.value)


PARSERS = {"own parser": parse_exposition, "prometheus-client": library_parse}


def scrape_directly(fleet: Nodes, timeout_s: float, runs: int, baseline: Path | None) -> None:
    others = [a for name, a in fleet.nodes.items() if not name.startswith("node-")]
    daemons = [a for name, a in fleet.nodes.items() if name.startswith("node-")]
    hostile = [*daemons[: 90 - len(others)], *others, *fleet.hanging, *fleet.refusing]
    fleets = {"all answer": [*daemons[: 100 - len(others)], *others], "5 hang, 5 refuse": hostile}
    print(f"\n(d) direct scraping of 100 nodes: {len(daemons[:80])} gpuwatch daemons, ", end="")
    print(f"{OTHER_EXPORTERS} dcgm-exporters, {OTHER_EXPORTERS} nvidia_gpu_exporters")
    print(f"    per-node timeout {timeout_s:g} s; the issue's bound: {timeout_s + 0.5:g} s")
    floor = statistics.median(_all_at_once(hostile, timeout_s) for _ in range(3))
    print(f"    100 GETs at once, standard library, 5 hang, 5 refuse: {floor:6.2f} s wall")
    print(f"    ScrapeSource.read(), in process, median of {runs} interleaved runs:")
    for name, addresses in fleets.items():
        walls = _read_with_each_parser(addresses, timeout_s, runs)
        own, library = walls["own parser"], walls["prometheus-client"]
        print(
            f"      {name:17} own parser {own:5.2f} s, prometheus-client {library:5.2f} s "
            f"({(library - own) / own:+.0%})"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as nodes_file:
        nodes_file.write("\n".join(hostile) + "\n")
        nodes_file.flush()
        argv = [*WHERE, "--nodes-file", nodes_file.name, "--timeout", f"{timeout_s:g}s"]
        commands = {"where": [gpuwatch_command(), *argv]}
        if baseline is not None:
            commands["where, baseline"] = [str(baseline / "bin" / "gpuwatch"), *argv]
        for name, wall in median_wall_s(commands, runs).items():
            print(f"    gpuwatch {name + ' --nodes-file':30} {wall:6.2f} s wall (whole process)")


def _read_with_each_parser(addresses: list[str], timeout_s: float, runs: int) -> dict[str, float]:
    """The median wall time of `ScrapeSource.read()` with each of `PARSERS`."""
    source = scrape.ScrapeSource(addresses, timeout_s=timeout_s)
    walls: dict[str, list[float]] = {name: [] for name in PARSERS}
    for _ in range(runs):
        for name, parse in PARSERS.items():
            scrape.parse_exposition = parse  # type: ignore[assignment]
            start = time.perf_counter()
            source.read()
            walls[name].append(time.perf_counter() - start)
    scrape.parse_exposition = parse_exposition
    return {name: statistics.median(values) for name, values in walls.items()}


def _all_at_once(addresses: list[str], timeout_s: float) -> float:
    def get(address: str) -> None:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
                r.read()
        except OSError:
            pass

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        list(pool.map(get, addresses))
    return time.perf_counter() - start


def load(prometheus: Prometheus, fleet: Nodes, nodes: int) -> None:
    """Prometheus scrapes the first `nodes` gpuwatch nodes, each read at least once, and
    has recorded the rules of each."""
    daemons = [address for name, address in fleet.nodes.items() if name.startswith("node-")]
    start = time.perf_counter()
    prometheus.set_targets(daemons[:nodes])
    prometheus.wait_for_count("gpuwatch_memory_free_bytes", nodes * 8)
    prometheus.wait_for_count("gpuwatch:node_gpu_models:count", nodes)
    print(f"\n{nodes} nodes scraped ({time.perf_counter() - start:.0f} s to load)")


def compare_where(url: str, runs: int, baseline: Path | None) -> None:
    print(f"(a)+(b) whole-process wall time, median of {runs} interleaved runs")
    where = [gpuwatch_command(), *WHERE, "--prometheus", url]
    answer = subprocess.run(where, capture_output=True, text=True, check=False)
    print(f"    gpuwatch where answers (exit {answer.returncode}): {_first_line(answer)}")
    commands = {
        "bare client": [sys.executable, "-c", BARE_CLIENT, url],
        "gpuwatch where": where,
        # Not at pick's default limits: each node's verdict does not do, and every family
        # placement reads is asked.
        "where --max-util 50": [*where, "--max-util", "50"],
    }
    if baseline is not None:  # another gpuwatch, in the same runs: before and after a change
        commands["where, baseline"] = [str(baseline / "bin" / "gpuwatch"), *where[1:]]
    medians = median_wall_s(commands, runs)
    for name, wall_s in medians.items():
        print(f"    {name:20} {wall_s * 1000:7.0f} ms  ({wall_s / medians['bare client']:.2f}x)")
    ratio = medians["gpuwatch where"] / medians["bare client"]
    print(f"    ratio {ratio:.2f} (the issue's bound: 2)")


def _first_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stdout or done.stderr).splitlines()
    return lines[0][:100] if lines else "(nothing)"


def refresh_cost(
    proxy: CountingProxy, nodes: int, refreshes: int, mode: str, interval_s: float
) -> tuple[str, ...]:
    """Steady refreshes `interval_s` apart, as the screen makes them (after a first read,
    which also learns the exporters and reads GPU identity): requests, bytes as sent
    (gzip) and as JSON, and time, the median refresh's and the largest. `mode`: see
    `MODES`; `proxy` hides the rules for "evaluated"."""
    source = PrometheusSource(proxy.url, needs=Needs(per_node=mode != "gpus"))
    times: list[float] = []
    seen, counts = "", []
    fleet = source.read()
    for _ in range(refreshes):
        time.sleep(interval_s)
        proxy.reset()
        start = time.perf_counter()
        before = source.client.bytes_read
        fleet = source.read()
        seen = str(len(fleet.nodes))
        json_bytes = source.client.bytes_read - before
        times.append(time.perf_counter() - start)
        sent = proxy.reset()
        counts.append((sent.body_bytes, sent.requests, json_bytes))
    # The typical refresh: some read slow-changing series too, every fifth or thirtieth.
    body_bytes, requests, json_bytes = sorted(counts)[len(counts) // 2]
    used = any(node.summary is not None for node in fleet.nodes)
    source.close()
    return (
        mode if used or mode == "gpus" else f"{mode} (not read)",
        str(nodes),
        str(requests),
        f"{body_bytes / 1024:,.0f}",
        f"{json_bytes / 1024:,.0f}",
        f"{max(c[2] for c in counts) / 1024:,.0f}",
        f"{statistics.median(times) * 1000:,.0f}",
        f"{max(times) * 1000:,.0f}",
        seen,
    )


def screen_cpu(
    urls: dict[str, str], interval_s: float, seconds: float, baseline: Path | None, runs: int
) -> None:
    """The screen's CPU, median of `runs`; with `baseline`, that environment's screen in
    the same runs, interleaved (the machine's load moves between runs)."""
    print(f"\n(e) gpuwatch fleet --interval {interval_s:g}: CPU of the whole process (tmux)")
    print(f"    measured for {seconds:g} s after 10 s, median of {runs} interleaved runs;")
    print("    the issue's bound: 5 % of one core")
    if not shutil.which("tmux"):
        print("    skipped (no tmux)")
        return
    commands = {"this": gpuwatch_command()}
    if baseline is not None:
        commands["baseline"] = str(baseline / "bin" / "gpuwatch")
    for mode, url in urls.items():
        pcts: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                argv = [command, "fleet", "--prometheus", url, "--interval", f"{interval_s:g}"]
                pcts[name].append(steady_cpu_pct(argv, warm_s=10, seconds=seconds))
        for name, found in pcts.items():
            runs_said = ", ".join(f"{pct:.1f}" for pct in found)
            median = statistics.median(found)
            print(f"    {mode:9} {name:8} {median:5.1f} % of one core ({runs_said})")


def print_table(rows: list[tuple[str, ...]]) -> None:
    print("\n(c) one refresh of the fleet through Prometheus (the issue's bounds: 0.5 s, 1 MiB)")
    print("    by PrometheusSource.read()")
    for mode, says in MODES.items():
        print(f"    {mode:9}  {says}")
    head = (
        "mode",
        "nodes",
        "queries",
        "KiB sent",
        "KiB JSON",
        "max KiB JSON",
        "ms (median)",
        "max ms",
        "nodes read",
    )
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    for row in (head, *rows):
        cells = (cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        print("    " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,500,1000", help="node counts for (c)")
    parser.add_argument("--where-at", type=int, default=500, help="node count for (a), (b)")
    parser.add_argument("--runs", type=int, default=11, help="runs of each timed command")
    parser.add_argument("--refreshes", type=int, default=10, help="refreshes timed for (c)")
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between refreshes, for (c)"
    )
    parser.add_argument("--scrape-interval", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--timeout", type=float, default=2.0, help="per-node, for (d)")
    parser.add_argument("--cpu-seconds", type=float, default=30.0, help="measured, for (e)")
    parser.add_argument("--screen-runs", type=int, default=1, help="runs of each screen, (e)")
    parser.add_argument(
        "--baseline", type=Path, metavar="VENV", help="also time this environment's where"
    )
    parser.add_argument("--parts", default="abcde", help="which figures, e.g. abd (default: all)")
    args = parser.parse_args()
    # As installed (pip compiles the bytecode): where PYTHONDONTWRITEBYTECODE is set, each
    # gpuwatch process would compile the package anew, which no user's does.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="fleet-cost-pyc-")
    sizes = sorted({*map(int, args.sizes.split(",")), args.where_at})
    print(f"nodes of 8 GPUs; Prometheus scrapes every {args.scrape_interval:g} s")
    rows = []
    others = {"dcgm": OTHER_EXPORTERS, "smi": OTHER_EXPORTERS}
    with serving_nodes(max(*sizes, 90), gpus=8, hang=5, refuse=5, **others) as fleet:
        if "d" in args.parts:
            scrape_directly(fleet, args.timeout, args.runs, args.baseline)
        if not set(args.parts) & set("abce"):
            return
        with (
            tempfile.TemporaryDirectory(prefix="fleet-cost-") as home,
            running_prometheus(Path(home), args.scrape_interval, [RULES]) as prometheus,
            CountingProxy(prometheus.url).running() as proxy,
            CountingProxy(prometheus.url, hide_rules=True).running() as raw_proxy,
        ):
            for nodes in sizes:
                load(prometheus, fleet, nodes)
                if nodes == args.where_at and set(args.parts) & set("ab"):
                    compare_where(prometheus.url, args.runs, args.baseline)
                if nodes == args.where_at and "e" in args.parts:
                    screen = {"evaluated": raw_proxy.url, "recorded": proxy.url}
                    screen_cpu(screen, 2.0, args.cpu_seconds, args.baseline, args.screen_runs)
                for mode, via in (("gpus", proxy), ("evaluated", raw_proxy), ("recorded", proxy)):
                    if "c" in args.parts:
                        rows.append(refresh_cost(via, nodes, args.refreshes, mode, args.interval))
    if rows:
        print_table(rows)


if __name__ == "__main__":
    main()
