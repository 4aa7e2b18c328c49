"""What the fleet table's refresh through Prometheus costs the client, and what `gpuwatch
where` costs, on a mixed fleet: 89 % gpuwatch daemons (exporting their node's figures),
10 % dcgm-exporters (the tests' page: 4 A100s), 1 % targets whose scrapes fail.

Prometheus is the tests' stand-in (bench/fleet_standin.py), in a process of its own so
that its CPU is not counted: it answers gpuwatch's queries as a server scraping the nodes
would, narrowed ones included, and this script moves its clock. A stand-in, not a real
Prometheus: a real one scraping 1,000 targets takes this 2-core machine's CPU from the
client measured, and only the client's work and the bytes it is sent are measured here. What is
measured is the client's side: the CPU of `PrometheusSource.read()` at the table's
refresh (2 s apart, each node scraped every 16 s: an eighth of them between two
refreshes), the bytes of JSON it is sent, the nodes it builds from their series; and the
CPU of `gpuwatch where -n 2` as a whole process, beside a client that sends one query for
free memory (`python -c`, the standard library), and of its read and its rules in process.

Run: python bench/fleet_refresh_cost.py [--nodes 1000] [--refreshes 24] [--where-runs 5]
For a before-and-after, run it with `PYTHONPATH=DIR` where DIR holds another gpuwatch (an
earlier commit's `git archive ... gpuwatch`): the client is that one, the stand-in always
this checkout's.
"""

from __future__ import annotations

import argparse
import inspect
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gpuwatch
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.placement import where as placement
from gpuwatch.request import Request

REPO = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().with_name("fleet_standin.py")
NOW = 1_795_472_800.0
REFRESH_S = 2.0
FREE_QUERY = "max by (job, instance, gpu) (gpuwatch_memory_free_bytes)"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return str(answer.read().decode())


def refreshes(url: str, count: int) -> None:
    """The first read and steady refreshes of the table's source (`nodes_built`: where
    the client counts them)."""
    clock = [NOW + 1]
    source = PrometheusSource(url, clock=lambda: clock[0], needs=Needs(per_node=True))
    rows = []
    for step in range(count + 1):
        get(f"{url}/advance?step={step}")
        clock[0] = NOW + step * REFRESH_S + 1
        built = getattr(source, "nodes_built", None)
        started = time.process_time()
        fleet = source.read()
        cpu_s = time.process_time() - started
        sent = int(get(f"{url}/bytes"))
        after = getattr(source, "nodes_built", None)
        rebuilt = None if built is None or after is None else after - built
        rows.append((cpu_s, sent, rebuilt, sum(n.up for n in fleet.nodes), len(fleet.nodes)))
    first, steady = rows[0], rows[1:]
    print(f"first read: {first[0] * 1000:.0f} ms CPU, {first[1] / 1024:.0f} KiB")
    cpu = statistics.median(r[0] for r in steady) * 1000
    sent_kib = statistics.median(r[1] for r in steady) / 1024
    counts = [r[2] for r in steady if r[2] is not None]
    built_text = f"{statistics.median(counts):.0f}" if counts else "(not counted)"
    print(
        f"steady refresh (median of {len(steady)}): {cpu:.0f} ms CPU, {sent_kib:.0f} KiB of "
        f"JSON, {built_text} nodes built; {steady[-1][3]} of {steady[-1][4]} nodes up; "
        f"{cpu / (REFRESH_S * 10):.1f} % of a core at one refresh each {REFRESH_S:g} s"
    )


def process_cpu_s(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def where_cost(url: str, runs: int) -> None:
    bare = (
        "import json, urllib.parse, urllib.request, sys;"
        f"q = urllib.parse.urlencode({{'query': {FREE_QUERY!r}}});"
        "json.load(urllib.request.urlopen(sys.argv[1] + '/api/v1/query?' + q))"
    )
    commands = {
        "one query (floor)": [sys.executable, "-c", bare, url],
        "where -n 2": [sys.executable, "-m", "gpuwatch", "where", "-n", "2", "--prometheus", url],
        "where -n 2 -v": [
            *(sys.executable, "-m", "gpuwatch", "where", "-n", "2", "-v", "--prometheus", url)
        ],
    }
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            cpu[name].append(process_cpu_s(argv))
    floor = statistics.median(cpu["one query (floor)"])
    for name, found in cpu.items():
        median = statistics.median(found)
        print(f"{name}: {median * 1000:.0f} ms CPU ({median / floor:.2f}x the floor)")


def where_in_process(url: str, runs: int) -> None:
    """`where -n 2`'s read and rules in this process (no start-up): the median CPU of each.
    The rules write their devices' reasons for the misses shown only, where the client
    can (`explain`), as the command does."""
    request = Request(count=2)
    lean = "explain" in inspect.signature(placement.where).parameters
    read_s, rules_s = [], []
    for _ in range(runs):
        started = time.process_time()
        fleet = PrometheusSource(url, needs=placement.needs_of(request)).read()
        read_s.append(time.process_time() - started)
        started = time.process_time()
        if lean:
            answer = placement.where(fleet, request, explain=False)
            placement.explained(fleet, request, answer.misses[:3])
        else:
            answer = placement.where(fleet, request)
        rules_s.append(time.process_time() - started)
    read_ms, rules_ms = statistics.median(read_s) * 1000, statistics.median(rules_s) * 1000
    fits = len(answer.fits)
    print(f"where -n 2 in process: read {read_ms:.0f} ms CPU, rules {rules_ms:.1f} ms ({fits} fit)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--refreshes", type=int, default=24)
    parser.add_argument("--where-runs", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the stand-in is this checkout's
    argv = [sys.executable, str(STANDIN), str(args.nodes)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO) as server:
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            print(f"{args.nodes} nodes; client: {Path(gpuwatch.__file__).parent}")
            refreshes(url, args.refreshes)
            where_in_process(url, args.where_runs * 3)
            where_cost(url, args.where_runs)
        finally:
            server.terminate()


if __name__ == "__main__":
    main()
