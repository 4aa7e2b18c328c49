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
(d) direct scraping of 100 nodes of which 5 hang and 5 refuse (`ScrapeSource.read()`
    and `gpuwatch where --nodes-file`): wall time beside the per-node timeout, and beside
    the floor of 100 concurrent standard-library GETs with that timeout;
(e) `gpuwatch fleet --interval 2` at 500 nodes, in a tmux pane: the CPU of the whole
    process in steady state, its figures evaluated (through the proxy that hides the
    rules) and recorded.

A figure the installed gpuwatch cannot give yet is skipped with a line that says why.
Prometheus runs on this machine too, so every figure carries its load.

Run: python bench/fleet_cost.py [--sizes 100,500,1000] [--where-at 500] [--runs 11]
                                [--scrape-interval 5] [--timeout 2] [--cpu-seconds 30]
                                [--baseline VENV]
(`--baseline /work/venvs/main` times that environment's `gpuwatch where` in the same
runs, for a before-and-after.) Bytecode is written under a temporary PYTHONPYCACHEPREFIX,
as an installed gpuwatch has it, even where PYTHONDONTWRITEBYTECODE is set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO
from _fleet import (
    CountingProxy,
    fleet_families,
    fleet_source,
    gpuwatch_command,
    has_command,
    median_wall_s,
    steady_cpu_pct,
)

sys.path.insert(0, str(REPO))  # the fleet's test harness starts the servers
from tests.helpers.fleet.endpoints import SimFleet, serving_sim_fleet
from tests.helpers.fleet.prometheus import Prometheus, Target, running_prometheus

MIB = 1 << 20
RULES = REPO / "examples" / "gpuwatch-fleet-rules.yml"
BARE_CLIENT = (
    "import json, sys, urllib.parse, urllib.request\n"
    "query = urllib.parse.urlencode({'query': 'gpuwatch_memory_free_bytes'})\n"
    "with urllib.request.urlopen(sys.argv[1] + '/api/v1/query?' + query, timeout=60) as r:\n"
    "    series = json.load(r)['data']['result']\n"
    "print(len(series))\n"
)
WHERE = ("where", "-n", "2", "--min-free", "40GiB")
MODES = {
    "gpus": "every GPU's series (fleet --json; a fleet with other exporters)",
    "evaluated": "the fleet table: each daemon's node figures, and what only Prometheus "
    "computes (idle holders, users) evaluated by it, where no rule records it",
    "recorded": "the same, that part recorded by examples/gpuwatch-fleet-rules.yml",
}


def scrape_directly(fleet: SimFleet, timeout_s: float, runs: int) -> None:
    print("\n(d) direct scraping: 90 nodes answer, 5 hang, 5 refuse")
    addresses = [*list(fleet.nodes.values())[:90], *fleet.hanging, *fleet.refusing]
    print(f"    per-node timeout {timeout_s:g} s; the issue's bound: {timeout_s + 0.5:g} s")
    floor = statistics.median(_all_at_once(addresses, timeout_s) for _ in range(3))
    print(f"    100 GETs at once, standard library:  {floor:6.2f} s wall")
    source, why = fleet_source("scrape", "ScrapeSource", addresses, timeout_s=timeout_s)
    if source is None:
        print(f"    ScrapeSource.read(): skipped ({why})")
    else:
        walls, up = [], 0
        for _ in range(3):
            start = time.perf_counter()
            up = sum(node.up for node in source.read().nodes)
            walls.append(time.perf_counter() - start)
        source.close()
        wall = statistics.median(walls)
        print(f"    ScrapeSource.read(), in process:     {wall:6.2f} s wall, {up} nodes up")
    help_text = has_command("where")
    if "--nodes-file" not in help_text:
        print("    gpuwatch where --nodes-file: skipped (this gpuwatch has no such option)")
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as nodes_file:
        nodes_file.write("\n".join(addresses) + "\n")
        nodes_file.flush()
        argv = [gpuwatch_command(), *WHERE, "--nodes-file", nodes_file.name]
        if "--timeout" in help_text:
            argv += ["--timeout", f"{timeout_s:g}s"]
        else:
            print("    (gpuwatch where has no --timeout: its default per-node timeout applies)")
        wall = median_wall_s({"where": argv}, runs)["where"]
    print(f"    gpuwatch where --nodes-file:          {wall:6.2f} s wall (whole process)")


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


def load(prometheus: Prometheus, fleet: SimFleet, nodes: int) -> None:
    """Prometheus scrapes the first `nodes` nodes, each scraped at least once."""
    addresses = list(fleet.nodes.values())[:nodes]
    start = time.perf_counter()
    prometheus.set_targets([Target(address) for address in addresses])
    prometheus.wait_until_up(addresses, timeout_s=900)
    prometheus.wait_for(
        "count(gpuwatch_memory_free_bytes)",
        lambda samples: bool(samples) and samples[0].value >= nodes * 8,
        f"{nodes} nodes' GPUs",
        timeout_s=900,
    )
    prometheus.wait_for(
        "count(gpuwatch:node_gpu_models:count)",
        lambda samples: bool(samples) and samples[0].value >= nodes,
        f"the recording rules of {nodes} nodes",
        timeout_s=900,
    )
    print(f"\n{nodes} nodes scraped ({time.perf_counter() - start:.0f} s to load)")


def compare_where(url: str, runs: int, baseline: Path | None) -> None:
    print(f"(a)+(b) whole-process wall time, median of {runs} interleaved runs")
    commands = {"bare client": [sys.executable, "-c", BARE_CLIENT, url]}
    where = [gpuwatch_command(), *WHERE, "--prometheus", url]
    if "--prometheus" in has_command("where"):
        answer = subprocess.run(where, capture_output=True, text=True, check=False)
        print(f"    gpuwatch where answers (exit {answer.returncode}): {_first_line(answer)}")
        if answer.returncode in (0, 4):
            commands["gpuwatch where"] = where
            # Not at pick's default limits: each node's verdict does not do, and every
            # family placement reads is asked.
            commands["where --max-util 50"] = [*where, "--max-util", "50"]
    if baseline is not None:  # another gpuwatch, in the same runs: before and after a change
        commands["where, baseline"] = [str(baseline / "bin" / "gpuwatch"), *where[1:]]
        subprocess.run(commands["where, baseline"], capture_output=True, check=False)
    medians = median_wall_s(commands, runs)
    for name, wall_s in medians.items():
        print(f"    {name:16} {wall_s * 1000:7.0f} ms  ({wall_s / medians['bare client']:.2f}x)")
    if "gpuwatch where" in medians:
        ratio = medians["gpuwatch where"] / medians["bare client"]
        print(f"    ratio {ratio:.2f} (the issue's bound: 2)")
    else:
        print("    gpuwatch where --prometheus: skipped (no such command here, or it failed)")


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
    per_node = mode != "gpus"
    source, _ = fleet_source("prometheus", "PrometheusSource", proxy.url, per_node=per_node)
    if source is None:
        source, _ = fleet_source("prometheus", "PrometheusSource", proxy.url)
        mode = "gpus"
    times: list[float] = []
    seen, counts = "", []
    if source is not None:
        source.read()
    for _ in range(refreshes):
        time.sleep(interval_s)
        proxy.reset()
        start = time.perf_counter()
        json_bytes = 0
        if source is not None:
            before = source.client.bytes_read
            seen = str(len(source.read().nodes))
            json_bytes = source.client.bytes_read - before
        else:
            _stand_in_refresh(proxy.url)
        times.append(time.perf_counter() - start)
        sent = proxy.reset()
        counts.append((sent.body_bytes, sent.requests, json_bytes))
    # The typical refresh: some read slow-changing series too, every fifth or thirtieth.
    body_bytes, requests, json_bytes = sorted(counts)[len(counts) // 2]
    used = getattr(source, "summarized", False)
    if source is not None:
        source.close()
    return (
        mode if used or mode == "gpus" else f"{mode} (not read)",
        str(nodes),
        str(requests),
        f"{body_bytes / 1024:,.0f}",
        f"{json_bytes / 1024:,.0f}" if json_bytes else "-",
        f"{max(c[2] for c in counts) / 1024:,.0f}",
        f"{statistics.median(times) * 1000:,.0f}",
        f"{max(times) * 1000:,.0f}",
        seen or "-",
    )


def screen_cpu(urls: dict[str, str], interval_s: float, seconds: float) -> None:
    print(f"\n(e) gpuwatch fleet --interval {interval_s:g}: CPU of the whole process (tmux)")
    print(f"    measured for {seconds:g} s after 10 s; the issue's bound: 5 % of one core")
    if not has_command("fleet") or not shutil.which("tmux"):
        print("    skipped (no gpuwatch fleet, or no tmux)")
        return
    for mode, url in urls.items():
        argv = [gpuwatch_command(), "fleet", "--prometheus", url, "--interval", f"{interval_s:g}"]
        pct = steady_cpu_pct(argv, warm_s=10, seconds=seconds)
        print(f"    {mode:6} {pct:5.1f} % of one core")


def _stand_in_refresh(url: str) -> None:
    """The queries a refresh sends: every family it reads in one selector, and `up`."""
    selector = '{__name__=~"' + "|".join(fleet_families()) + '"}'
    for query in (selector, "up"):
        request = urllib.request.Request(
            f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}",
            headers={"Accept-Encoding": "gzip"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            body = answer.read()
            if answer.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
        json.loads(body)


def print_table(rows: list[tuple[str, ...]]) -> None:
    print("\n(c) one refresh of the fleet through Prometheus (the issue's bounds: 0.5 s, 1 MiB)")
    _, why = fleet_source("prometheus", "PrometheusSource", "http://127.0.0.1:9")
    print(f"    by {'PrometheusSource.read()' if not why else f'the stand-in queries: {why}'}")
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
    parser.add_argument(
        "--baseline", type=Path, metavar="VENV", help="also time this environment's where"
    )
    args = parser.parse_args()
    # As installed (pip compiles the bytecode): where PYTHONDONTWRITEBYTECODE is set, each
    # gpuwatch process would compile the package anew, which no user's does.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="fleet-cost-pyc-")
    sizes = sorted({*map(int, args.sizes.split(",")), args.where_at})
    print(f"nodes of 8 GPUs; Prometheus scrapes every {args.scrape_interval:g} s")
    rows = []
    with serving_sim_fleet(max(*sizes, 90), gpus=8, hang=5, refuse=5) as fleet:
        scrape_directly(fleet, args.timeout, runs=3)
        with (
            tempfile.TemporaryDirectory(prefix="fleet-cost-") as home,
            running_prometheus(
                Path(home), (), args.scrape_interval, rule_files=[RULES]
            ) as prometheus,
            CountingProxy(prometheus.url).running() as proxy,
            CountingProxy(prometheus.url, hide_rules=True).running() as raw_proxy,
        ):
            for nodes in sizes:
                load(prometheus, fleet, nodes)
                if nodes == args.where_at:
                    compare_where(prometheus.url, args.runs, args.baseline)
                    screen = {"evaluated": raw_proxy.url, "recorded": proxy.url}
                    screen_cpu(screen, 2.0, args.cpu_seconds)
                for mode, via in (("gpus", proxy), ("evaluated", raw_proxy), ("recorded", proxy)):
                    rows.append(refresh_cost(via, nodes, args.refreshes, mode, args.interval))
    print_table(rows)


if __name__ == "__main__":
    main()
