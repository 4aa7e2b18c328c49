"""Helpers of bench/fleet_cost.py: a counting proxy in front of Prometheus, whole-process
timing, and the fleet sources and commands of whatever version of gpuwatch is installed
(each may be missing: the bench then says so and skips that figure)."""

from __future__ import annotations

import http.client
import importlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The gpuwatch series a fleet refresh reads, where this version has no gpuwatch.fleet.series.
_GPUWATCH_FAMILIES = (
    "gpuwatch_sampling_up",
    "gpuwatch_sample_timestamp_seconds",
    "gpuwatch_gpu_info",
    "gpuwatch_gpu_up",
    "gpuwatch_leases",
    "gpuwatch_lease_declared_memory_bytes",
    "gpuwatch_process_memory_bytes",
    "gpuwatch_mig_enabled",
    "gpuwatch_memory_total_bytes",
    "gpuwatch_memory_used_bytes",
    "gpuwatch_memory_free_bytes",
    "gpuwatch_utilization_ratio",
    "gpuwatch_temperature_celsius",
    "gpuwatch_power_watts",
)


@dataclass
class Counts:
    requests: int = 0
    body_bytes: int = 0


_NO_RULES = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
_RULES_PROBE = "gpuwatch%3Anode_gpu_models%3Acount"


class _Server(ThreadingHTTPServer):
    # A client sends a refresh's dozen queries at once: with the standard backlog of 5,
    # the kernel drops the connections past it, and each is retried a second later, a
    # delay the proxy would add to what it measures.
    request_queue_size = 128


class CountingProxy:
    """A reverse proxy on loopback that forwards every request to `upstream` and counts
    requests and the bytes of the answers' bodies as sent (compressed, when the client
    asked for it): what a client of `url` costs, whatever its code. `hide_rules`: it
    answers the query for a recording rule's series with nothing, so that a client
    reads the fleet GPU by GPU although the server records the rules."""

    def __init__(self, upstream: str, *, hide_rules: bool = False) -> None:
        self.hide_rules = hide_rules
        self.counts = Counts()
        self._lock = threading.Lock()
        self._upstream = urllib.parse.urlsplit(upstream)
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def reset(self) -> Counts:
        with self._lock:
            counts, self.counts = self.counts, Counts()
        return counts

    @contextmanager
    def running(self) -> Iterator[CountingProxy]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        if self.hide_rules and _RULES_PROBE in path:
            return 200, [("Content-Type", "application/json")], _NO_RULES
        connection = http.client.HTTPConnection(self._upstream.netloc, timeout=120)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            connection.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        passed = {"accept-encoding", "content-type", "authorization", "accept"}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() in passed}
                status, answer_headers, answer = proxy._forward(
                    self.command, self.path, headers, body
                )
                with proxy._lock:
                    proxy.counts.requests += 1
                    proxy.counts.body_bytes += len(answer)
                self.send_response(status)
                for key, value in answer_headers:
                    if key.lower() in ("content-type", "content-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = _relay

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


class Terminal:
    """A program in a detached tmux session of its own (120x40), started with `exec` so
    that the pane's pid is the program's: its CPU time is read from /proc."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.tmux = ["tmux", "-L", f"fleet-bench-{uuid.uuid4().hex[:8]}"]  # a server of its own
        command = f"exec env TERM=xterm-256color {shlex.join(argv)}"
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", "bench", "-x", "120", "-y", "40", command],
            check=True,
        )
        pane = [*self.tmux, "display-message", "-p", "-t", "bench", "#{pane_pid}"]
        self.pid = int(subprocess.run(pane, capture_output=True, text=True, check=True).stdout)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True, check=False)


def steady_cpu_pct(argv: Sequence[str], warm_s: float, seconds: float) -> float:
    """Percent of one core a program uses, measured for `seconds` after `warm_s`."""
    terminal = Terminal(argv)
    try:
        time.sleep(warm_s)
        before = terminal.cpu_s()
        time.sleep(seconds)
        return 100 * (terminal.cpu_s() - before) / seconds
    finally:
        terminal.close()


def gpuwatch_command() -> str:
    """The `gpuwatch` of this interpreter's environment (the same Python as the baseline)."""
    beside = Path(sys.executable).with_name("gpuwatch")
    return str(beside) if beside.exists() else shutil.which("gpuwatch") or "gpuwatch"


def has_command(*argv: str) -> str:
    """The `--help` text of `gpuwatch ARGV`, or "" where this version has no such command."""
    done = subprocess.run(
        [gpuwatch_command(), *argv, "--help"], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else ""


def median_wall_s(commands: Mapping[str, Sequence[str]], runs: int) -> dict[str, float]:
    """Median wall time of each whole process, runs interleaved so that the machine's
    drift hits all alike. Exit status 0 and 4 (gpuwatch: nothing fits) both count."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
            if done.returncode not in (0, 4):
                raise SystemExit(
                    f"{name} failed ({done.returncode}): {done.stderr.decode()[-500:]}"
                )
    return {name: statistics.median(values) for name, values in times.items()}


def fleet_families() -> tuple[str, ...]:
    """The metric names a fleet refresh reads: gpuwatch.fleet.series's where it exists."""
    try:
        series = importlib.import_module("gpuwatch.fleet.series")
    except ImportError:
        return _GPUWATCH_FAMILIES
    return tuple(series.FAMILIES)


def fleet_source(module: str, class_name: str, *args: Any, **options: Any) -> tuple[Any, str]:
    """`gpuwatch.fleet.MODULE.CLASS(*args, **options)`, or None and why not."""
    try:
        cls = getattr(importlib.import_module(f"gpuwatch.fleet.{module}"), class_name)
    except (ImportError, AttributeError):
        return None, f"this gpuwatch has no gpuwatch.fleet.{module}.{class_name}"
    try:
        return cls(*args, **options), ""
    except TypeError as error:
        return None, f"gpuwatch.fleet.{module}.{class_name}: {error}"
