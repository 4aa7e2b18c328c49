"""What the fleet screen costs at its own pace, this checkout beside another, against a
Prometheus already running (e.g. one that bench/fleet_cost.py's harness started, or a
real one).

For each mode (raw: every GPU's series; rules: the recording rules, where recorded) and
each checkout, in turn: `PrometheusSource.read()` every 2 s as the screen's reader calls
it (the next read 2 s after the last began, at once where a read took longer), in a
process of that checkout's Python: the median wall time of a read, its mean CPU time,
the mean and largest JSON read and the queries; then `gpuwatch fleet --interval 2` in a
tmux pane, the CPU of the whole process in steady state.

Run: python bench/fleet_screen_cost.py URL [--baseline-python /path/to/venv/bin/python]
                                        [--reads 10] [--cpu-seconds 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from _fleet import CountingProxy, steady_cpu_pct

READS = """
import statistics, sys, time
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
source = PrometheusSource(sys.argv[1], needs=Needs(per_node=sys.argv[2] == "rules"))
source.read()
walls, cpus, sizes, queries = [], [], [], []
due = time.monotonic()
for _ in range(int(sys.argv[3])):
    due = max(due + 2.0, time.monotonic())
    time.sleep(max(0.0, due - time.monotonic()))
    size, sent = source.client.bytes_read, source.queries_sent
    wall, cpu = time.perf_counter(), time.process_time()
    fleet = source.read()
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
    sizes.append(source.client.bytes_read - size)
    queries.append(source.queries_sent - sent)
print(f"{statistics.median(walls) * 1000:7,.0f} ms {statistics.mean(cpus) * 1000:6,.0f} ms CPU"
      f" {statistics.mean(sizes) / 1024:7,.0f} KiB JSON (largest {max(sizes) / 1024:,.0f})"
      f" {statistics.mean(queries):5.1f} queries  {len(fleet.nodes)} nodes")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="Prometheus, e.g. http://127.0.0.1:9090")
    parser.add_argument("--baseline-python", help="another checkout's virtualenv python")
    parser.add_argument("--reads", type=int, default=10, help="reads timed per mode")
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    args = parser.parse_args()
    pythons = {"this": sys.executable}
    if args.baseline_python:
        pythons = {"before": args.baseline_python, **pythons}
    print("PrometheusSource.read() every 2 s: median wall, mean CPU, mean JSON, queries")
    for mode in ("raw", "rules"):
        for name, python in pythons.items():
            argv = [python, "-c", READS, args.url, mode, str(args.reads)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            print(f"    {mode:5} {name:6} {(done.stdout or done.stderr).strip()[-200:]}")
    print(f"gpuwatch fleet --interval 2, CPU of the whole process over {args.cpu_seconds:g} s")
    with CountingProxy(args.url, hide_rules=True).running() as raw:
        for mode, url in (("raw", raw.url), ("rules", args.url)):
            for name, python in pythons.items():
                gpuwatch = str(Path(python).with_name("gpuwatch"))
                argv = [gpuwatch, "fleet", "--prometheus", url, "--interval", "2"]
                pct = steady_cpu_pct(argv, warm_s=10, seconds=args.cpu_seconds)
                print(f"    {mode:5} {name:6} {pct:5.1f} % of one core")


if __name__ == "__main__":
    main()
