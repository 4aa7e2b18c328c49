"""The fleet commands at 1,000, 3,000 and 10,000 nodes, through a Prometheus stand-in.

For each N, bench/prom_standin.py answers gpuwatch's queries for a mixed fleet of N
targets (89 % gpuwatch daemons of 8 GPUs, 8 % dcgm-exporter and 2 % nvidia_gpu_exporter
nodes serving recorded pages, 1 % down), each scraped every 15 s at its own phase (a
real Prometheus scraping 10,000 targets does not fit a 2-core machine beside the client;
the stand-in answers query for query as one does: see its docstring). Then, whole
processes of this checkout's `gpuwatch`:

(a) `where -n 2`: its CPU time (user + system) beside that of a client that sends one
    query for free memory (`gpuwatch_memory_free_bytes`, the standard library, the
    same Python), medians of interleaved runs, and their ratio (the goal: 3x at 10,000);
(b) `fleet --json`: CPU-s, wall time, peak RSS, exit status and the first line of its
    errors (the goal: it completes within its default timeout, in 1 GiB); where its
    answers are over its default cap, again with `--max-bytes 1GiB`;
(c) the screen, `gpuwatch fleet` at its default refresh in a tmux pane (120x40): the
    time from start to the first frame with nodes, its share of a core in steady state,
    and the time from a filter (`/` WORD Enter) and a sort (`s`) to the pane showing it
    (tmux's own redraw in it: a tenth of a second or so).

Each command runs once unmeasured first: the stand-in builds what it answers from at the
first query that asks it (a Prometheus has it at hand). It runs on this machine too, so
wall times carry its load; CPU times are the process's own.

Run: python bench/fleet_scale.py [--nodes 1000,3000,10000] [--runs 5] [--cpu-seconds 30]
                                 [--no-screen]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from _fleet import BARE_CLIENT, Terminal, gpuwatch_command, serving

STANDIN = Path(__file__).resolve().with_name("prom_standin.py")


@contextmanager
def standin(nodes: int) -> Iterator[str]:
    """The stand-in's URL, until the block ends (it stops when its standard input does)."""
    with serving([sys.executable, str(STANDIN), "--nodes", str(nodes)]) as ready:
        yield str(ready["url"])


def measured(argv: Sequence[str]) -> tuple[int, float, float, int, str]:
    """Runs `argv`: its exit status, CPU seconds, wall seconds, peak RSS in bytes and the
    first line it wrote on stderr."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    errors = process.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.perf_counter() - start
    cpu_s = usage.ru_utime + usage.ru_stime
    first = errors.strip().splitlines()[0] if errors.strip() else ""
    return process.returncode, cpu_s, wall_s, usage.ru_maxrss * 1024, first


def where_ratio(url: str, runs: int) -> str:
    gpuwatch = gpuwatch_command()
    commands = {
        "client": [sys.executable, "-c", BARE_CLIENT, url],
        "where": [gpuwatch, "where", "-n", "2", "--prometheus", url],
    }
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    statuses = set()
    for _ in range(runs):
        for name, argv in commands.items():
            status, cpu_s, _, _, _ = measured(argv)
            cpu[name].append(cpu_s)
            statuses.add((name, status))
    client, where = (statistics.median(cpu[name]) for name in commands)
    return (
        f"where -n 2: {where:.2f} CPU-s, one-query client {client:.2f} CPU-s: "
        f"{where / client:.2f}x  (exit {sorted(s for n, s in statuses if n == 'where')})"
    )


def fleet_json(url: str) -> list[str]:
    """`fleet --json`'s figures; where its answers are over its default cap, again with
    `--max-bytes 1GiB` (where this checkout has it)."""
    argv = [gpuwatch_command(), "fleet", "--json", "--prometheus", url]
    lines = []
    for options in ([], ["--max-bytes", "1GiB"]):
        status, cpu_s, wall_s, rss, error = measured([*argv, *options])
        said = f"  {error!r}" if error else ""
        lines.append(
            f"fleet --json {' '.join(options)}: exit {status}, {cpu_s:.1f} CPU-s, "
            f"{wall_s:.1f} s wall, peak RSS {rss / (1 << 20):.0f} MiB{said}"
        )
        if "too large" not in error or not _has_max_bytes():
            break
    return lines


@functools.cache
def _has_max_bytes() -> bool:
    help_text = [gpuwatch_command(), "fleet", "--help"]
    usage = subprocess.run(help_text, capture_output=True, text=True, check=True).stdout
    return "--max-bytes" in usage


def warm(url: str) -> None:
    """Each command once, unmeasured: the stand-in builds its index of each family, and
    the answers that are the same at every read, at the first query that asks them."""
    options = ["--prometheus", url, "--timeout", "5m"]
    options += ["--max-bytes", "1GiB"] if _has_max_bytes() else []
    for command in (["where", "-n", "2"], ["fleet", "--once"], ["fleet", "--json"]):
        subprocess.run([gpuwatch_command(), *command, *options], capture_output=True, check=False)


def screen(url: str, cpu_seconds: float) -> str:
    argv = [gpuwatch_command(), "fleet", "--prometheus", url]
    start = time.perf_counter()
    terminal = Terminal(argv)
    try:
        first = _until(terminal, lambda text: "gpu-0" in text, 120) - start
        time.sleep(5)
        before = terminal.cpu_s()
        time.sleep(cpu_seconds)
        share = 100 * (terminal.cpu_s() - before) / cpu_seconds
        filtered = _keys(terminal, ["/", "dcgm", "Enter"], lambda text: "gpu-0" not in text)
        cleared = _keys(terminal, ["Escape"], lambda text: "gpu-0" in text)
        sort = _keys(terminal, ["s"], _changed(_pane(terminal)))
        return (
            f"screen: first frame {first:.1f} s, {share:.1f} % of a core, filter "
            f"{filtered:.2f} s, cleared {cleared:.2f} s, sort {sort:.2f} s"
        )
    finally:
        terminal.close()


def _pane(terminal: Terminal) -> str:
    capture = [*terminal.tmux, "capture-pane", "-p", "-t", "bench"]
    return subprocess.run(capture, capture_output=True, text=True, check=False).stdout


def _until(terminal: Terminal, shown: Callable[[str], bool], timeout_s: float) -> float:
    """When the pane first shows what `shown` looks for (polled every 20 ms)."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if shown(_pane(terminal)):
            return time.perf_counter()
        time.sleep(0.02)
    return float("nan")


def _keys(terminal: Terminal, keys: Sequence[str], shown: Callable[[str], bool]) -> float:
    start = time.perf_counter()
    for key in keys:
        send = [*terminal.tmux, "send-keys", "-t", "bench"]
        literal = len(key) > 1 and key.islower()  # a word typed, else a key's name
        subprocess.run([*send, "-l", key] if literal else [*send, key], check=True)
    return _until(terminal, shown, 60) - start


def _changed(before: str) -> Callable[[str], bool]:
    rows = _rows(before)
    return lambda text: _rows(text) != rows


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if "-0" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,3000,10000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cpu-seconds", type=float, default=30.0)
    parser.add_argument("--no-screen", action="store_true")
    args = parser.parse_args()
    for nodes in (int(n) for n in args.nodes.split(",")):
        started = time.perf_counter()
        with standin(nodes) as url:
            warm(url)
            print(f"N = {nodes:,} (stand-in ready in {time.perf_counter() - started:.0f} s)")
            print("  " + where_ratio(url, args.runs), flush=True)
            print("\n".join("  " + line for line in fleet_json(url)), flush=True)
            if not args.no_screen:
                print("  " + screen(url, args.cpu_seconds), flush=True)


if __name__ == "__main__":
    main()
