"""One process serving the `/metrics` of N simulated gpuwatch nodes, one loopback port each,
plus nodes that hang (accept, never answer) and nodes that refuse.

Each node's text is what a gpuwatch daemon serves: it is rendered once by the daemon's own
exposition code (`gpuwatch.daemon.metrics`) from a node of GPUS GPUs with its own
`hostname`, uuids and mix of work (idle, part used, full; some GPUs leased), and its
readings then move every second (utilization, memory in use and free, temperature, power,
the node's figures made of them, the sample's timestamp) without rendering it all again, so
that one process keeps up with 1,000 nodes scraped every second or two.

With --jobs each node also tells the work around its GPUs, as a daemon that reads Slurm
does: jobs waiting in line on every fifth node, and a Slurm job on each GPU in use (and on
each idle leased GPU: a job that holds its GPU and leaves it idle for half an hour).

With --dcgm N and --smi N it also serves N nodes of each other exporter the fleet reads,
each the recorded output of the tests (`tests/fleet/data/dcgm.prom`, dcgm-exporter on 4
H100s, its `Hostname` made `dcgm-0001`, ...; `nvidia_smi_node.prom`, nvidia_gpu_exporter on
2 H100s, which names no host), as it is.

When every port listens it prints one JSON line on stdout,
`{"nodes": [{"name", "address"}], "hanging": [address], "refusing": [address]}`,
and serves until SIGTERM or SIGINT, or with --stop-on-eof until its standard input ends
(a pipe from the process that started it: it then never outlives that process).

Run: python bench/fleet_nodes.py [--nodes N] [--gpus G] [--hang H] [--refuse R] [--seed S] [--jobs]
                                 [--dcgm N] [--smi N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import resource
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.backends.scenario import MODELS
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.view import View
from gpuwatch.models import GpuSample, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.request import Request, Waiter
from gpuwatch.sampling.poller import PollState

GIB = 1 << 30
MIB = 1 << 20
MODEL = MODELS["H100-80GB"]
CAPACITY_BYTES = MODEL.memory_total_bytes - MODEL.memory_reserved_bytes
_BUS_NUMBERS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_HEAD = (
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
    "Content-Length: {}\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
RECORDED = Path(__file__).resolve().parents[1] / "tests" / "fleet" / "data"


@dataclass(frozen=True)
class GpuLoad:
    """What runs on one GPU: the memory its job holds and its mean utilization."""

    used_bytes: int
    utilization_pct: int
    leased: bool


def draw_node(rng: random.Random, gpus: int) -> tuple[GpuLoad, ...]:
    """A node as shared nodes are: about a third of GPUs idle, a third part used, a third
    full; one GPU in ten held by an exclusive lease."""
    loads = []
    for _ in range(gpus):
        kind = rng.random()
        if kind < 0.35:
            used, util = 0, 0
        elif kind < 0.7:
            used, util = rng.randrange(4, 60) * GIB, rng.randrange(10, 70)
        else:
            used, util = CAPACITY_BYTES - rng.randrange(1, 4) * GIB, rng.randrange(70, 100)
        loads.append(GpuLoad(used, util, leased=rng.random() < 0.1))
    return tuple(loads)


def snapshot_of(name: str, loads: tuple[GpuLoad, ...], node_number: int, now: float) -> Snapshot:
    gpus = tuple(
        GpuSample(
            index=index,
            uuid=f"GPU-{node_number:08x}-{index:04x}-4000-8000-{node_number * 8 + index:012x}",
            name=MODEL.name,
            pci_bus_id=f"00000000:{_BUS_NUMBERS[index % 8] + index // 8:02X}:00.0",
            memory_total_bytes=MODEL.memory_total_bytes,
            memory_used_bytes=load.used_bytes,
            memory_free_bytes=CAPACITY_BYTES - load.used_bytes,
            memory_reserved_bytes=MODEL.memory_reserved_bytes,
            utilization_pct=load.utilization_pct,
            memory_utilization_pct=load.utilization_pct * 6 // 10,
            temperature_c=30 + load.utilization_pct * 4 // 10,
            power_w=MODEL.idle_power_w + (MODEL.power_limit_w - MODEL.idle_power_w) * 0.5,
            power_limit_w=MODEL.power_limit_w,
            sm_clock_mhz=MODEL.max_sm_clock_mhz,
            performance_state=0,
            mig_enabled=False,
        )
        for index, load in enumerate(loads)
    )
    processes = tuple(
        ProcessUsage(
            pid=20_000 + index,
            gpu_index=index,
            gpu_uuid=gpus[index].uuid,
            memory_used_bytes=load.used_bytes,
            kind=ProcessKind.COMPUTE,
            user=f"user{(node_number + index) % 23}",
            command="python train.py",
        )
        for index, load in enumerate(loads)
        if load.used_bytes
    )
    return Snapshot(now, name, "580.95.05", "13.0", gpus, processes)


def leases_of(snapshot: Snapshot, loads: tuple[GpuLoad, ...]) -> tuple[Lease, ...]:
    return tuple(
        Lease(str(gpu.uuid), gpu.index, 30_000 + gpu.index, "", "", snapshot.taken_at)
        for gpu, load in zip(snapshot.gpus, loads, strict=True)
        if load.leased
    )


def waiters_of(node_number: int) -> tuple[Waiter, ...]:
    """Two jobs in line on every fifth node, waiting 30s and 90s."""
    if node_number % 5:
        return ()
    return tuple(Waiter(40_000 + n, "user1", Request(), waited_s=w) for n, w in enumerate((90, 30)))


def job_lines(snapshot: Snapshot, loads: tuple[GpuLoad, ...], node_number: int) -> list[str]:
    """The series of a daemon that reads Slurm: its jobs are known, each GPU in use is held
    by its process's user's job, computing; an idle leased GPU by a job that left it idle."""
    host = f'hostname="{snapshot.hostname}"'
    lines = [f"gpuwatch_jobs_known{{{host}}} 1.0"]
    for gpu, load in zip(snapshot.gpus, loads, strict=True):
        if not (load.used_bytes or load.leased):
            continue
        user = f"user{(node_number + gpu.index) % 23}"
        ids = f'gpu="{gpu.index}",{host}'
        job = f'job_id="{100_000 + node_number * 64 + gpu.index}",job_user="{user}"'
        idle_s = 0.0 if load.used_bytes else 1800.0
        lines.append(f'gpuwatch_gpu_job_info{{{ids},{job},uuid="{gpu.uuid}"}} 1.0')
        lines.append(f'gpuwatch_gpu_allocated_idle_seconds{{{ids},uuid="{gpu.uuid}"}} {idle_s!r}')
    return lines


_JOB_FAMILIES = frozenset(
    {"gpuwatch_jobs_known", "gpuwatch_gpu_job_info", "gpuwatch_gpu_allocated_idle_seconds"}
)


def _family(line: str) -> str:
    """The metric a line of the text format belongs to, comment lines included."""
    if line.startswith("# "):
        return line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
    return line.split("{", 1)[0].split(" ", 1)[0]


# The series whose values move each second: (metric, reading of the GPU at second s).
Reading = Callable[[GpuLoad, int], float]


def _wiggle(load: GpuLoad, second: int, span: int) -> int:
    """A deterministic jitter in [-span, span] for this GPU and second."""
    return (hash((id(load), second)) % (2 * span + 1)) - span


def _used(load: GpuLoad, second: int) -> float:
    return 0.0 if not load.used_bytes else float(load.used_bytes + _wiggle(load, second, 256) * MIB)


def _util(load: GpuLoad, second: int) -> float:
    return (
        max(0, min(100, load.utilization_pct + _wiggle(load, second, 5))) if load.used_bytes else 0
    )


_MOVING: dict[str, Reading] = {
    "gpuwatch_memory_used_bytes": _used,
    "gpuwatch_memory_free_bytes": lambda load, s: CAPACITY_BYTES - _used(load, s),
    "gpuwatch_process_memory_bytes": _used,
    "gpuwatch_utilization_ratio": lambda load, s: _util(load, s) / 100,
    "gpuwatch_memory_utilization_ratio": lambda load, s: _util(load, s) * 0.006,
    "gpuwatch_temperature_celsius": lambda load, s: 30 + _util(load, s) * 0.4,
    "gpuwatch_power_watts": lambda load, s: round(
        MODEL.idle_power_w + (MODEL.power_limit_w - MODEL.idle_power_w) * _util(load, s) / 100, 1
    ),
}


_NODE_MOVING: dict[str, tuple[Callable[[list[float]], float], Reading]] = {
    "gpuwatch_node_memory_free_bytes": (sum, _MOVING["gpuwatch_memory_free_bytes"]),
    "gpuwatch_node_memory_free_max_bytes": (max, _MOVING["gpuwatch_memory_free_bytes"]),
    "gpuwatch_node_utilization_ratio": (
        lambda ratios: sum(ratios) / len(ratios),
        _MOVING["gpuwatch_utilization_ratio"],
    ),
    "gpuwatch_node_temperature_max_celsius": (max, _MOVING["gpuwatch_temperature_celsius"]),
    "gpuwatch_node_power_watts": (sum, _MOVING["gpuwatch_power_watts"]),
}
"""The node's own figures, which move with its GPUs': (how they combine, each GPU's reading)."""


class Node:
    """One node's `/metrics`: the daemon's text, its moving values filled in each second."""

    def __init__(
        self, name: str, number: int, loads: tuple[GpuLoad, ...], *, jobs: bool = False
    ) -> None:
        self.name = name
        self._loads = loads
        snapshot = snapshot_of(name, loads, number, time.time())
        view = View(
            PollState(snapshot, None, snapshot.taken_at, 1, snapshot.taken_at),
            leases=leases_of(snapshot, loads),
            waiters=waiters_of(number) if jobs else (),
        )
        lines = exposition(view).decode().splitlines()
        if jobs:  # the daemon's own job series say "unknown" (it reads no Slurm here)
            lines = [line for line in lines if _family(line) not in _JOB_FAMILIES]
            lines += job_lines(snapshot, loads, number)
        self._parts = [self._part(line) for line in lines]
        self._second = -1
        self._body = b""

    def body(self, now: float) -> bytes:
        second = int(now)
        if second != self._second:
            self._second, self._body = second, self._render(now, second)
        return self._body

    def _part(self, line: str) -> tuple[str, Reading | None, GpuLoad | None] | str:
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "gpuwatch_sample_timestamp_seconds":
            return (line.rsplit(" ", 1)[0], None, None)
        if name in _MOVING:
            gpu = int(line.split('gpu="', 1)[1].split('"', 1)[0])
            return (line.rsplit(" ", 1)[0], _MOVING[name], self._loads[gpu])
        if name in _NODE_MOVING:
            combine, per_gpu = _NODE_MOVING[name]
            loads = self._loads

            def figure(_: GpuLoad, second: int) -> float:
                return combine([per_gpu(load, second) for load in loads])

            return (line.rsplit(" ", 1)[0], figure, loads[0])
        return line

    def _render(self, now: float, second: int) -> bytes:
        lines = []
        for part in self._parts:
            if isinstance(part, str):
                lines.append(part)
            else:
                prefix, reading, load = part
                value = now if reading is None or load is None else reading(load, second)
                lines.append(f"{prefix} {float(value)!r}")
        return ("\n".join(lines) + "\n").encode()


class Recorded:
    """A node of another exporter: its recorded `/metrics`, the same at every scrape."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self._body = text.encode()

    def body(self, now: float) -> bytes:
        return self._body


def recorded_nodes(dcgm: int, smi: int) -> list[Recorded]:
    """`dcgm` dcgm-exporter nodes named `dcgm-0001`, ... and `smi` nvidia_gpu_exporter ones."""
    dcgm_text = (RECORDED / "dcgm.prom").read_text()
    smi_text = (RECORDED / "nvidia_smi_node.prom").read_text()
    nodes = [
        Recorded(f"dcgm-{n:04d}", dcgm_text.replace("dcgm-node-1", f"dcgm-{n:04d}"))
        for n in range(1, dcgm + 1)
    ]
    return nodes + [Recorded(f"smi-{n:04d}", smi_text) for n in range(1, smi + 1)]


async def _serve_node(
    node: Node | Recorded, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if path.split(b"?", 1)[0] == b"/metrics":
                body = node.body(time.time())
                writer.write(_HEAD.format(len(body)).encode() + body)
            else:
                writer.write(_NOT_FOUND)
            await writer.drain()
            if b"connection: close" in head.lower():
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


_HELD: list[asyncio.StreamWriter] = []


async def _hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    _HELD.append(writer)  # accepted, never answered nor closed, until the process ends


def _address(sock: socket.socket) -> str:
    return f"127.0.0.1:{sock.getsockname()[1]}"


def _loopback_listener() -> socket.socket:
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    listener.setblocking(False)
    return listener


async def serve(
    nodes: list[Node | Recorded], hanging: int, refusing: int, stop_on_eof: bool
) -> None:
    listeners = [_loopback_listener() for _ in nodes]
    for node, listener in zip(nodes, listeners, strict=True):
        await asyncio.start_server(functools.partial(_serve_node, node), sock=listener)
    hung = [_loopback_listener() for _ in range(hanging)]
    for listener in hung:
        await asyncio.start_server(_hang, sock=listener)
    closed = [socket.socket() for _ in range(refusing)]
    for placeholder in closed:  # bound, never listening: connections are refused
        placeholder.bind(("127.0.0.1", 0))
    ready = {
        "nodes": [
            {"name": n.name, "address": _address(s)} for n, s in zip(nodes, listeners, strict=True)
        ],
        "hanging": [_address(s) for s in hung],
        "refusing": [_address(s) for s in closed],
    }
    print(json.dumps(ready), flush=True)
    await _until_told_to_stop(stop_on_eof)


async def _until_told_to_stop(stop_on_eof: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if stop_on_eof:
        loop.add_reader(sys.stdin.fileno(), _stop_at_eof, stop)
    await stop.wait()


def _stop_at_eof(stop: asyncio.Event) -> None:
    if not os.read(sys.stdin.fileno(), 4096):
        stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hang", type=int, default=0)
    parser.add_argument("--refuse", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default="node-", help="node names: PREFIX0001, ...")
    parser.add_argument("--stop-on-eof", action="store_true", help="stop when stdin ends")
    parser.add_argument(
        "--jobs", action="store_true", help="tell jobs in line and the Slurm job on each GPU"
    )
    parser.add_argument("--dcgm", type=int, default=0, help="dcgm-exporter nodes besides")
    parser.add_argument("--smi", type=int, default=0, help="nvidia_gpu_exporter nodes besides")
    args = parser.parse_args()
    # A listener and a connection or two per node: past the usual soft limit of 1,024.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rng = random.Random(args.seed)
    nodes: list[Node | Recorded] = [
        Node(f"{args.prefix}{number:04d}", number, draw_node(rng, args.gpus), jobs=args.jobs)
        for number in range(1, args.nodes + 1)
    ]
    nodes += recorded_nodes(args.dcgm, args.smi)
    asyncio.run(serve(nodes, args.hang, args.refuse, args.stop_on_eof))


if __name__ == "__main__":
    main()
