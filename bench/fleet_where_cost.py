"""What `gpuwatch where` costs through Prometheus on a fleet as an admin sets it up, beside a
client that sends one query; and what a Prometheus that answers too much costs it.

One process (bench/fleet_nodes.py) serves the `/metrics` of 300 simulated gpuwatch nodes
of 8 GPUs and 40 dcgm-exporter nodes (the tests' recorded page, 4 H100s each), plus 5
addresses where nothing listens; a real Prometheus (Debian's `prometheus`) scrapes them in
two jobs, `gpuwatch` (the 300 and the 5 dead targets, never up) and `dcgm`. Then, whole
processes, runs interleaved, medians:

(a) the bare client: one PromQL query for free memory (`gpuwatch_memory_free_bytes`) with
    the standard library, `python -c ...`, the same Python as gpuwatch;
(b) `gpuwatch where -n 4 --min-free 40GiB --prometheus URL`, and its ratio to (a) (the
    issue's bound: 3x); with --baseline VENV, that environment's `where` in the same runs;
(c) `gpuwatch where --timeout 5s` against a Prometheus stand-in that answers every query
    with 60 MiB of series: its exit status, wall time and peak memory (the issue's bound:
    exit 6 within 6 s, under 200 MB).

Prometheus runs on this machine too, so every figure carries its load.

Run: python bench/fleet_where_cost.py [--runs 11] [--scrape-interval 5] [--baseline VENV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _fleet import BARE_CLIENT, gpuwatch_command, median_wall_s, running_prometheus, serving_nodes

GPUWATCH_NODES, DCGM_NODES, DEAD = 300, 40, 5
WHERE = ("where", "-n", "4", "--min-free", "40GiB")
PEAK_OF = (
    "import resource, subprocess, sys, time\n"
    "start = time.monotonic()\n"
    "status = subprocess.run(sys.argv[1:], capture_output=True, check=False).returncode\n"
    "took = time.monotonic() - start\n"
    "print(status, took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def compare_where(url: str, runs: int, baseline: Path | None) -> None:
    where = [gpuwatch_command(), *WHERE, "--prometheus", url]
    answer = subprocess.run(where, capture_output=True, text=True, check=False)
    lines = (answer.stdout or answer.stderr).splitlines()
    print(f"    gpuwatch where answers (exit {answer.returncode}), {len(lines)} lines, the first:")
    print(f"      {lines[0][:110] if lines else '(nothing)'}")
    commands = {"bare client": [sys.executable, "-c", BARE_CLIENT, url], "gpuwatch where": where}
    if baseline is not None:
        commands["where, baseline"] = [str(baseline / "bin" / "gpuwatch"), *where[1:]]
    medians = median_wall_s(commands, runs)
    print(f"(a)+(b) whole-process wall time, median of {runs} interleaved runs")
    for name, wall_s in medians.items():
        print(f"    {name:20} {wall_s * 1000:7.0f} ms  ({wall_s / medians['bare client']:.2f}x)")
    ratio = medians["gpuwatch where"] / medians["bare client"]
    print(f"    ratio {ratio:.2f} (the issue's bound: 3)")


class _Flood(BaseHTTPRequestHandler):
    """Answers every request with 60 MiB of one series over and over, as fast as read."""

    series = (
        b'{"metric":{"__name__":"gpuwatch_memory_free_bytes","gpu":"0","instance":'
        b'"gpu-00001:19400","job":"gpuwatch"},"value":[1795472800.0,"85899345920"]}'
    )

    def do_GET(self) -> None:
        head = b'{"status":"success","data":{"resultType":"vector","result":['
        body_bytes = 60 << 20
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            self.wfile.write(head)
            block = b",".join([self.series] * 1000) + b","
            for _ in range(body_bytes // len(block)):
                self.wfile.write(block)
            self.wfile.write(self.series + b"]}}")
        except OSError:
            pass  # the client gave up, as it should

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def flooding() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def against_a_flood(runs: int) -> None:
    print("\n(c) gpuwatch where --timeout 5s, a Prometheus answering 60 MiB a query")
    with flooding() as url:
        where = [gpuwatch_command(), "where", "--prometheus", url, "--timeout", "5s"]
        results = []
        for _ in range(runs):
            done = subprocess.run(
                [sys.executable, "-c", PEAK_OF, *where], capture_output=True, text=True, check=True
            )
            status, took, peak_kib = done.stdout.split()
            results.append((int(status), float(took), int(peak_kib) * 1024))
    statuses = sorted({status for status, _, _ in results})
    walls = [took for _, took, _ in results]
    peaks = [peak for _, _, peak in results]
    wall, peak = statistics.median(walls), statistics.median(peaks) / 1e6
    print(f"    exit status {statuses}; wall median {wall:.2f} s, most {max(walls):.2f} s;")
    print(f"    peak memory median {peak:.0f} MB, most {max(peaks) / 1e6:.0f} MB")
    print("    (the bound: exit 6, within 6 s, under 200 MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="runs of each timed command")
    parser.add_argument("--scrape-interval", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--baseline", type=Path, metavar="VENV", help="also time its where")
    args = parser.parse_args()
    # As installed (pip compiles the bytecode): where PYTHONDONTWRITEBYTECODE is set, each
    # gpuwatch process would compile the package anew, which no user's does.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="fleet-where-pyc-")
    print(f"{GPUWATCH_NODES} gpuwatch nodes of 8 GPUs, {DCGM_NODES} dcgm-exporter nodes of 4, ")
    print(f"{DEAD} targets never up; Prometheus scrapes every {args.scrape_interval:g} s")
    with (
        serving_nodes(GPUWATCH_NODES, gpus=8, refuse=DEAD, dcgm=DCGM_NODES) as fleet,
        tempfile.TemporaryDirectory(prefix="fleet-where-") as home,
        running_prometheus(Path(home), args.scrape_interval) as prometheus,
    ):
        daemons = [a for name, a in fleet.nodes.items() if name.startswith("node-")]
        dcgm = [a for name, a in fleet.nodes.items() if name.startswith("dcgm-")]
        start = time.perf_counter()
        prometheus.set_targets([*daemons, *fleet.refusing], {"dcgm": dcgm})
        prometheus.wait_for_count("gpuwatch_memory_free_bytes", GPUWATCH_NODES * 8)
        prometheus.wait_for_count("DCGM_FI_DEV_FB_FREE", DCGM_NODES * 4)
        prometheus.wait_for_count("up == 0", DEAD)
        print(f"loaded in {time.perf_counter() - start:.0f} s\n")
        compare_where(prometheus.url, args.runs, args.baseline)
    against_a_flood(max(3, args.runs // 3))


if __name__ == "__main__":
    main()
