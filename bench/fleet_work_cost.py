"""What reading each node's line of waiting jobs and Slurm jobs adds to a fleet refresh
through Prometheus.

Two real Prometheus servers on this machine each scrape N simulated gpuwatch nodes of 8 GPUs
(bench/fleet_nodes.py): one fleet as today's daemon serves it (the line of waiting jobs, no
jobs), one whose nodes also tell the Slurm job on each GPU in use (`--jobs`). One refresh
(`PrometheusSource.read()`) is timed against each, by this checkout's gpuwatch and, where
given, by another checkout's (`--baseline-python`, e.g. main's virtualenv): the runs are
interleaved so that the machine's load hits all alike. Printed per configuration: queries,
JSON bytes read and the median time of a refresh.

Run: python bench/fleet_work_cost.py [--nodes 300] [--runs 7] [--baseline-python PY]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _fleet import running_prometheus, serving_nodes

ONE_READ = (
    "import json, sys, time\n"
    "from gpuwatch.fleet.prometheus import PrometheusSource\n"
    "source = PrometheusSource(sys.argv[1], timeout_s=60)\n"
    "source.read()\n"
    "before, sent = source.client.bytes_read, source.queries_sent\n"
    "start = time.perf_counter()\n"
    "fleet = source.read()\n"
    "took = time.perf_counter() - start\n"
    "jobs = sum(n.jobs is not None for n in fleet.nodes)\n"
    "print(json.dumps({'s': took, 'bytes': source.client.bytes_read - before,\n"
    "    'queries': source.queries_sent - sent, 'nodes': len(fleet.nodes), 'with_jobs': jobs}))\n"
)


def one_read(python: str, url: str) -> dict[str, float]:
    # Run from elsewhere: `-c` puts the working directory first on the path, and this
    # checkout's gpuwatch would pass for the baseline's.
    done = subprocess.run(
        [python, "-c", ONE_READ, url],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline-python", default="", help="another checkout's python")
    args = parser.parse_args()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as home:
        urls = {}
        for jobs in (False, True):
            sim = stack.enter_context(serving_nodes(args.nodes, jobs=jobs))
            prometheus = stack.enter_context(running_prometheus(Path(home) / f"prom-{jobs}", 5.0))
            prometheus.set_targets(list(sim.nodes.values()))
            urls["jobs" if jobs else "no jobs"] = prometheus.url
            # Every node's GPUs and, with jobs, every node's jobs known.
            prometheus.wait_for_count("gpuwatch_memory_free_bytes", args.nodes * 8)
            prometheus.wait_for_count("gpuwatch_jobs_known == 1" if jobs else "up", args.nodes)
        pythons = {"this checkout": sys.executable}
        if args.baseline_python:
            pythons["baseline"] = args.baseline_python
        configs = [(p, f) for p in pythons for f in urls]
        results: dict[tuple[str, str], list[dict[str, float]]] = {c: [] for c in configs}
        for _ in range(args.runs):
            for who, fleet in configs:
                results[(who, fleet)].append(one_read(pythons[who], urls[fleet]))
        print(f"{args.nodes} nodes of 8 GPUs, scraped every 5s; {args.runs} interleaved runs")
        for (who, fleet), runs in results.items():
            last = runs[-1]
            median_ms = statistics.median(r["s"] for r in runs) * 1000
            print(
                f"{who:>14}, fleet {fleet:<8}: {last['queries']:.0f} queries, "
                f"{last['bytes'] / 1e6:.2f} MB JSON, median {median_ms:.0f} ms, "
                f"{last['nodes']:.0f} nodes ({last['with_jobs']:.0f} with jobs known)"
            )


if __name__ == "__main__":
    main()
