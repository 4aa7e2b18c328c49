"""A simulated fleet: N nodes of simulated GPUs, for demos, tests and `gpuwatch fleet --sim N`.

It is to fleet sources what the `sim` backend is to one machine (and it builds each
node's snapshot with that backend): nodes `node-01`, `node-02`, ... with a mix of
GPU models, idle and busy GPUs, Slurm jobs of several users (some holding a GPU they leave
idle), gpuwatch leases and, on some nodes, jobs waiting in line for GPUs. Once the
fleet has at least `TROUBLE_FROM_NODES` nodes, some are down (never read), some stale
(their data minutes old), and the last runs dcgm-exporter, so its leases and processes
are unknown. Everything is a pure function of the seed and the clock: the same moment
reads the same, and values drift as the clock runs.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable
from typing import Literal

import msgspec
from msgspec.structs import replace

from gpuwatch.backends.scenario import (
    MODELS,
    GpuModel,
    Load,
    LoadShape,
    Scenario,
    SimGpu,
    SimProcess,
)
from gpuwatch.backends.sim import SimBackend
from gpuwatch.fleet_model import Exporter, FleetState, GpuJob, NodeState
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Lease, Snapshot

MAX_SIM_NODES = 10_000
TROUBLE_FROM_NODES = 5
"""Fleets this big or bigger have down, stale and dcgm-exporter nodes among them."""
STALE_AGE_S = 300.0
"""How old a stale node's data is."""
_GIB = 1 << 30
_MODELS = ("H100-80GB", "H100-80GB", "A100-80GB", "A100-40GB", "L4")
_GPU_COUNTS = (8, 8, 8, 4, 2)
_USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
_DOWN, _STALE = 13, 17
"""Node k (from 0) is down when k % 13 == 5, stale when k % 17 == 8."""
_WAITING = 6
"""Node k has jobs waiting in line for its GPUs when k % 6 == 3."""
_IDLE_JOB = "python train.py --resume"
"""The job that holds its GPU and does nothing with it."""
_Health = Literal["up", "down", "stale"]
"""Whether a node is read (`up`), never read (`down`), or read with minutes-old data."""


class _Node(msgspec.Struct, frozen=True):
    name: str
    backend: SimBackend
    health: _Health
    exporter: Exporter
    leases: tuple[Lease, ...] | None
    delay_s: float
    """How old its data is when read (scrape interval), or `STALE_AGE_S` when stale."""
    waiting: tuple[int, float] | None = None
    """Jobs in line and the oldest one's wait; `None` where the exporter does not tell."""
    jobs: tuple[GpuJob, ...] | None = None


class SimFleet:
    """`SimFleet(20)`: twenty simulated nodes, read with `read()` like any `FleetSource`;
    `history(node)` gives a node's past as the Prometheus source does."""

    def __init__(
        self, count: int, *, seed: int = 0, clock: Callable[[], float] = time.time
    ) -> None:
        if not 1 <= count <= MAX_SIM_NODES:
            raise ValueError(f"a simulated fleet has 1 to {MAX_SIM_NODES} nodes, not {count}")
        self._clock = clock
        self._pinned: float | None = None
        self._lock = threading.Lock()  # history() moves the nodes' clock: one reader at a time
        width = max(2, len(str(count)))
        self._nodes = tuple(
            _plan(f"node-{k + 1:0{width}d}", k, count, seed, self._time) for k in range(count)
        )
        self._by_name = {node.name: node for node in self._nodes}

    @property
    def description(self) -> str:
        return f"simulated ({len(self._nodes)} nodes)"

    def read(self) -> FleetState:
        """Every node now: down ones without a snapshot, stale ones with old data."""
        with self._lock:
            now = self._clock()
            return FleetState(
                now, self.description, tuple(self._state(n, now) for n in self._nodes)
            )

    def history(
        self, node: str, *, duration_s: float = 600.0, points: int = 240
    ) -> tuple[GpuSeries, ...]:
        """The node's GPUs over the last `duration_s`, `points` samples each; empty for a
        node that is not in the fleet or is down."""
        found = self._by_name.get(node)
        if found is None or found.health == "down" or points < 1:
            return ()
        with self._lock:
            end = self._clock() - found.delay_s
            times = [
                end - duration_s * (points - 1 - i) / max(1, points - 1) for i in range(points)
            ]
            snapshots = [self._sample_at(found, at) for at in times]
        return tuple(_series(snapshots, index) for index in range(len(snapshots[0].gpus)))

    def close(self) -> None:
        """Nothing to release."""

    def _time(self) -> float:
        return self._clock() if self._pinned is None else self._pinned

    def _sample_at(self, node: _Node, at: float) -> Snapshot:
        self._pinned = at
        try:
            return node.backend.sample()
        finally:
            self._pinned = None

    def _state(self, node: _Node, now: float) -> NodeState:
        if node.health == "down":
            refused = "connection refused"
            return NodeState(node.name, False, None, None, refused, node.exporter, None)
        snapshot = self._sample_at(node, now - node.delay_s)
        if node.exporter is not Exporter.GPUWATCH:
            snapshot = replace(snapshot, processes=())  # dcgm-exporter names no process
        up = node.health == "up"
        error = None if up else f"no new data for {STALE_AGE_S / 60:.0f} min"
        waiters, longest_wait_s = node.waiting or (None, None)
        return NodeState(
            node.name,
            up,
            snapshot,
            now - node.delay_s,
            error,
            node.exporter,
            node.leases,
            waiters,
            longest_wait_s,
            node.jobs,
        )


def _plan(name: str, k: int, count: int, seed: int, clock: Callable[[], float]) -> _Node:
    rng = random.Random(f"gpuwatch-fleet:{seed}:{k}")
    troubled = count >= TROUBLE_FROM_NODES
    health: _Health = "up"
    if troubled and k % _DOWN == 5:
        health = "down"
    elif troubled and k % _STALE == 8:
        health = "stale"
    exporter = Exporter.DCGM if troubled and k == count - 1 else Exporter.GPUWATCH
    model = MODELS[rng.choice(_MODELS)]
    gpus, processes, leases = [], [], []
    for index in range(rng.choice(_GPU_COUNTS)):
        gpu, work, lease = _gpu(rng, name, index, model, seed)
        gpus.append(gpu)
        processes += [replace(p, pid=50_000 + 100 * index + n) for n, p in enumerate(work)]
        leases += [lease] if lease is not None else []
    scenario = Scenario(name, "580.95.05", "13.0", seed, tuple(gpus), tuple(processes))
    delay_s = STALE_AGE_S if health == "stale" else float(1 + k % 4)
    known = tuple(leases) if exporter is Exporter.GPUWATCH else None
    backend = SimBackend(scenario, clock=clock)
    if exporter is not Exporter.GPUWATCH:
        return _Node(name, backend, health, exporter, known, delay_s)
    waiting = (1 + k % 3, 40.0 + 97.0 * (k % 5)) if k % _WAITING == 3 else (0, 0.0)
    return _Node(name, backend, health, exporter, known, delay_s, waiting, _jobs(k, processes))


def _jobs(k: int, processes: list[SimProcess]) -> tuple[GpuJob, ...]:
    """A Slurm job per user of a node, holding the GPUs that user's processes run on; the
    job that holds a GPU and does nothing with it has left it idle for 40 minutes or more."""
    jobs: dict[int, GpuJob] = {}
    for process in processes:
        if process.user not in _USERS:
            continue  # a service (the inference server) runs outside Slurm
        job_id = str(41_000 + 10 * k + _USERS.index(process.user))
        idle_s = 2400.0 + 60.0 * (k % 30) if process.command == _IDLE_JOB else 0.0
        jobs[process.gpu] = GpuJob(process.gpu, job_id, process.user, idle_s)
    return tuple(jobs[index] for index in sorted(jobs))


def _gpu(
    rng: random.Random, node: str, index: int, model: GpuModel, seed: int
) -> tuple[SimGpu, list[SimProcess], Lease | None]:
    """One GPU and its work: idle, training, inference, a notebook, or held but idle."""
    total_bytes = model.memory_total_bytes
    digest = hashlib.sha1(f"gpuwatch-fleet:{seed}:{node}:{index}".encode()).hexdigest()
    uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    phase_s = int(digest[32:36], 16) / 0xFFFF * 60
    user = rng.choice(_USERS)
    roll = rng.random()
    processes: list[SimProcess] = []
    lease: Lease | None = None
    if roll < 0.4:
        load = Load(LoadShape.IDLE)
    elif roll < 0.65:
        load = Load(LoadShape.SINE, 75, 100, 45, phase_s)
        used = int(total_bytes * rng.uniform(0.6, 0.9))
        processes.append(_process(index, user, "python train.py", used))
        lease = _lease(node, uuid, index, None)
    elif roll < 0.8:
        load = Load(LoadShape.RANDOM, 15, 65, 20, phase_s)
        for _ in range(2):
            processes.append(_process(index, "svc-infer", "tritonserver", total_bytes // 6))
        lease = _lease(node, uuid, index, total_bytes // 2)
    elif roll < 0.92:
        load = Load(LoadShape.SQUARE, 0, 35, 30, phase_s)
        processes.append(_process(index, user, "python -m ipykernel_launcher", 6 * _GIB))
    else:  # a job that holds its GPU and does nothing with it
        load = Load(LoadShape.IDLE)
        processes.append(_process(index, user, _IDLE_JOB, 20 * _GIB))
        lease = _lease(node, uuid, index, None)
    bus = f"00000000:{0x18 + 0x10 * index:02X}:00.0"
    gpu = SimGpu(model=model, uuid=uuid, pci_bus_id=bus, load=load)
    return gpu, processes, lease


def _process(gpu: int, user: str, command: str, memory_bytes: int) -> SimProcess:
    return SimProcess(gpu, 0, user, command, memory_bytes, memory_bytes)


def _lease(node: str, uuid: str, index: int, mem_bytes: int | None) -> Lease:
    """A lease as a node's metrics tell it: no holder's pid, user or command."""
    mode = "exclusive" if mem_bytes is None else "shared"
    lease_id = f"{node}/{uuid}/{mode}/0"
    return Lease(uuid, index, 0, "", "", 0.0, mem_bytes=mem_bytes, lease_id=lease_id)


def _series(snapshots: list[Snapshot], index: int) -> GpuSeries:
    gpus = [snapshot.gpus[index] for snapshot in snapshots]
    return GpuSeries(
        index=index,
        uuid=gpus[0].uuid,
        taken_at=[snapshot.taken_at for snapshot in snapshots],
        memory_used_bytes=[gpu.memory_used_bytes for gpu in gpus],
        utilization_pct=[gpu.utilization_pct for gpu in gpus],
        temperature_c=[gpu.temperature_c for gpu in gpus],
        power_w=[gpu.power_w for gpu in gpus],
    )
