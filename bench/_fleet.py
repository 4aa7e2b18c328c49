"""The fleet benches' own harness (nothing from tests/): the simulated nodes of
`fleet_nodes.py` in a process of their own, a real Prometheus scraping them, a counting
proxy in front of it, and whole-process timing."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FLEET_NODES = Path(__file__).resolve().with_name("fleet_nodes.py")
BARE_CLIENT = (  # the client to compare with: one query for free memory
    "import json, sys, urllib.parse, urllib.request\n"
    "query = urllib.parse.urlencode({'query': 'gpuwatch_memory_free_bytes'})\n"
    "with urllib.request.urlopen(sys.argv[1] + '/api/v1/query?' + query, timeout=60) as r:\n"
    "    series = json.load(r)['data']['result']\n"
    "print(len(series))\n"
)


@dataclass(frozen=True)
class Nodes:
    """What `fleet_nodes.py` serves: each node's name and address, and the addresses that
    hang and refuse."""

    nodes: dict[str, str]
    hanging: tuple[str, ...]
    refusing: tuple[str, ...]


@contextmanager
def serving_nodes(count: int, **options: int | bool) -> Iterator[Nodes]:
    """`fleet_nodes.py --nodes COUNT --OPTION VALUE ...` (`jobs=True`: `--jobs`), until the
    block ends (it stops when its standard input does)."""
    argv = [sys.executable, str(FLEET_NODES), "--nodes", str(count), "--stop-on-eof"]
    for name, value in options.items():
        flag = f"--{name.replace('_', '-')}"
        argv += [flag] if value is True else [] if value is False else [flag, str(value)]
    with serving(argv) as ready:
        nodes = {node["name"]: node["address"] for node in ready["nodes"]}
        yield Nodes(nodes, tuple(ready["hanging"]), tuple(ready["refusing"]))


@contextmanager
def serving(argv: Sequence[str]) -> Iterator[dict[str, Any]]:
    """A server process that writes one JSON line when it serves (what it serves), until
    the block ends: it stops when its standard input does."""
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            ready = json.loads(process.stdout.readline() or "null")
            if ready is None:
                raise SystemExit(f"{argv[1]} ended before serving")
            yield ready
        finally:
            process.stdin.close()
            process.wait(timeout=60)


class Prometheus:
    """A real Prometheus on a free loopback port, its data in `home`, scraping the
    targets it is given (job `gpuwatch`) every `interval_s` and recording `rule_files`."""

    def __init__(self, home: Path, interval_s: float, rule_files: Sequence[Path] = ()) -> None:
        self.home, self.interval_s, self.rule_files = home, interval_s, tuple(rule_files)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config((), {})
        argv = [
            shutil.which("prometheus") or sys.exit("needs prometheus (apt-get install prometheus)"),
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        with (home / "prometheus.log").open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.wait_for("vector(1)", bool, "Prometheus to answer")

    def set_targets(
        self, addresses: Sequence[str], other_jobs: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """Scrapes `addresses` (job `gpuwatch`), and each of `other_jobs`' addresses in
        that job, from now on (a reload)."""
        self._write_config(addresses, other_jobs or {})
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        urllib.request.urlopen(request, timeout=60).close()

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query's series, each its labels and value."""
        query = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=60) as answer:
            result = json.load(answer)["data"]["result"]
        return [(item["metric"], float(item["value"][1])) for item in result]

    def wait_for(
        self,
        promql: str,
        condition: Callable[[list[tuple[dict[str, str], float]]], bool],
        what: str,
        timeout_s: float = 900.0,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition(self.query(promql)):
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.2)
        raise SystemExit(f"timed out waiting for {what} (see {self.home / 'prometheus.log'})")

    def wait_for_count(self, selector: str, count: int) -> None:
        """Until Prometheus holds at least `count` series of `selector` now."""

        def enough(found: list[tuple[dict[str, str], float]]) -> bool:
            return bool(found) and found[0][1] >= count

        self.wait_for(f"count({selector})", enough, f"{count} series of {selector}")

    def stop(self) -> None:
        self._process.send_signal(signal.SIGTERM)
        self._process.wait(timeout=60)

    def _write_config(
        self, addresses: Sequence[str], other_jobs: Mapping[str, Sequence[str]]
    ) -> None:
        interval = f"{round(self.interval_s * 1000)}ms"
        jobs = {"gpuwatch": addresses, **other_jobs}
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]}
                for job, targets in jobs.items()
            ],
        }
        (self.home / "prometheus.yml").write_text(json.dumps(config))


@contextmanager
def running_prometheus(
    home: Path, interval_s: float, rule_files: Sequence[Path] = ()
) -> Iterator[Prometheus]:
    prometheus = Prometheus(home, interval_s, rule_files)
    try:
        yield prometheus
    finally:
        prometheus.stop()


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


def gpuwatch_command(python: str = sys.executable) -> str:
    """The `gpuwatch` of that Python's environment."""
    return str(Path(python).with_name("gpuwatch"))


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
