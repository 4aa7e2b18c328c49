"""Stand-in nodes on loopback: in the test's own process, a dcgm-exporter that serves a
recorded text (`data/dcgm.prom`), a node that accepts and never answers, and one that
refuses; in one other process, a fleet of many simulated gpuwatch nodes.

Each is an `Endpoint` (`address` is `127.0.0.1:PORT`, what `--node` and a Prometheus
target take) and a context manager: leaving it closes every socket it opened.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.fleet.servers import DATA, Reply, serving

FLEET_NODES = Path(__file__).resolve().parents[3] / "bench" / "fleet_nodes.py"
DCGM_FIXTURE = DATA / "dcgm.prom"
# The node and GPUs `data/dcgm.prom` describes, for tests that check what a source made of it.
DCGM_HOSTNAME = "dcgm-node-1"
DCGM_FREE_MIB = (80980, 40020, 1980, 68692)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def address(self) -> str:
        """`HOST:PORT`, as `--node` and a Prometheus target take it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"


@contextmanager
def serving_dcgm(fixture: Path = DCGM_FIXTURE) -> Iterator[Endpoint]:
    """A dcgm-exporter stand-in serving `fixture` on `/metrics` (by default the node
    `DCGM_HOSTNAME`), 404 elsewhere."""
    text = fixture.read_bytes()

    def route(path: str, headers: dict[str, str]) -> Reply:
        return Reply(text) if path.split("?", 1)[0] == "/metrics" else Reply(status=404)

    with serving(route) as base:
        parts = urllib.parse.urlsplit(base)
        yield Endpoint(parts.hostname or "", parts.port or 0)


RECORDED = DATA / "recorded"
_COLLECTED = re.compile(
    rb"^(nvidia_smi_last_collect_success_timestamp_seconds(?:\{.*\})?) \S+$", re.M
)


@contextmanager
def serving_recorded(name: str) -> Iterator[Endpoint]:
    """An exporter serving the recorded page `data/recorded/NAME` as it is, but for the
    time of nvidia_gpu_exporter's last collection, which says now (a page of 2025 would
    be stale): a node as its exporter shows it today."""
    text = (RECORDED / name).read_bytes()

    def route(path: str, headers: dict[str, str]) -> Reply:
        if path.split("?", 1)[0] != "/metrics":
            return Reply(status=404)
        return Reply(_COLLECTED.sub(rb"\1 " + repr(time.time()).encode(), text))

    with serving(route) as base:
        parts = urllib.parse.urlsplit(base)
        yield Endpoint(parts.hostname or "", parts.port or 0)


@contextmanager
def hanging() -> Iterator[Endpoint]:
    """A node whose exporter is stuck: it accepts every connection, reads nothing and
    never answers, until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the block ended
            held.append(connection)

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield Endpoint("127.0.0.1", listener.getsockname()[1])
    finally:
        stop.set()
        # shutdown() wakes the accept() that close() alone would leave blocked.
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()
        for connection in held:
            connection.close()


@contextmanager
def refusing() -> Iterator[Endpoint]:
    """A node where nothing listens: connecting is refused at once. The port stays bound
    (never listening) until the block ends, so that no other server takes it meanwhile."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        yield Endpoint("127.0.0.1", placeholder.getsockname()[1])


@dataclass(frozen=True)
class SimFleet:
    """Many simulated gpuwatch nodes served by one process (`bench/fleet_nodes.py`):
    `nodes` maps each node's name (its `hostname` label) to its address."""

    nodes: dict[str, str]
    hanging: tuple[str, ...]
    refusing: tuple[str, ...]


@contextmanager
def serving_sim_fleet(
    nodes: int,
    *,
    gpus: int = 8,
    hang: int = 0,
    refuse: int = 0,
    seed: int = 0,
    jobs: bool = False,
) -> Iterator[SimFleet]:
    """`nodes` gpuwatch nodes of `gpus` GPUs each (names `node-0001`, ...), plus `hang`
    addresses that accept and never answer and `refuse` that refuse, all in one process
    that ends with the block; with `jobs`, nodes tell jobs in line and the Slurm job on
    each GPU, as a daemon that reads Slurm does."""
    argv = [sys.executable, str(FLEET_NODES), "--nodes", str(nodes), "--gpus", str(gpus)]
    argv += ["--hang", str(hang), "--refuse", str(refuse), "--seed", str(seed), "--stop-on-eof"]
    argv += ["--jobs"] if jobs else []
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as process:
        assert process.stdin is not None and process.stdout is not None
        try:
            line = process.stdout.readline()
            assert line, f"{FLEET_NODES} ended before serving (exit {process.wait()})"
            ready = json.loads(line)
            yield SimFleet(
                {node["name"]: node["address"] for node in ready["nodes"]},
                tuple(ready["hanging"]),
                tuple(ready["refusing"]),
            )
        finally:
            process.stdin.close()
            process.wait(timeout=30)
