"""Frames, sources and apps for the `gpuwatch tui` tests."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs.job_table import Job, JobTable, NodeJobs
from gpuwatch.models import GpuSample, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.request import Request, Waiter
from gpuwatch.tui.common.frames import Frame, HostStats
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.sources import LocalSource, Source
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.wait import wait_until_async

GIB = 1 << 30
HOST = HostStats(
    cpu_pct=12.0,
    cpu_count=16,
    memory_used_bytes=40 * GIB,
    memory_total_bytes=128 * GIB,
    swap_used_bytes=0,
    swap_total_bytes=8 * GIB,
    load_1m=1.5,
    load_5m=1.25,
    load_15m=1.0,
)


def gpu(index: int, *, used_gib: float = 10, util: int = 50, error: str | None = None) -> GpuSample:
    if error is not None:
        return GpuSample(
            index=index,
            uuid=f"GPU-{index}",
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=None,
            error=error,
        )
    return GpuSample(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=None,
        memory_total_bytes=80 * GIB,
        memory_used_bytes=int(used_gib * GIB),
        memory_free_bytes=int((79.5 - used_gib) * GIB),
        memory_reserved_bytes=GIB // 2,
        utilization_pct=util,
        temperature_c=40 + util // 2,
        power_w=100.0 + 5 * util,
        power_limit_w=700.0,
    )


def process(
    pid: int,
    gpu_index: int,
    *,
    user: str = "alice",
    gib: float = 4,
    command: str = "python train.py",
    started_at: float | None = FROZEN_TIME - 3600,
) -> ProcessUsage:
    return ProcessUsage(
        pid=pid,
        gpu_index=gpu_index,
        gpu_uuid=f"GPU-{gpu_index}",
        memory_used_bytes=int(gib * GIB),
        kind=ProcessKind.COMPUTE,
        user=user,
        command=command,
        cpu_pct=25.0,
        rss_bytes=2 * GIB,
        started_at=started_at,
    )


def frame(
    gpus: Sequence[GpuSample],
    processes: Sequence[ProcessUsage] = (),
    *,
    taken_at: float = FROZEN_TIME,
    leases: Sequence[Lease] = (),
    waiters: Sequence[Waiter] = (),
    source: str = "node1",
) -> Frame:
    snapshot = Snapshot(taken_at, source, "580.95.05", "13.0", tuple(gpus), tuple(processes))
    return Frame(source, snapshot, tuple(leases), tuple(waiters), HOST)


def lease(gpu_index: int, pid: int, *, user: str = "carol", mem_gib: float | None = None) -> Lease:
    return Lease(
        gpu_uuid=f"GPU-{gpu_index}",
        gpu_index=gpu_index,
        pid=pid,
        user=user,
        command="python finetune.py",
        started_at=FROZEN_TIME - 7200,
        mem_bytes=None if mem_gib is None else int(mem_gib * GIB),
        lease_id=f"lease-{pid}",
    )


def waiter(pid: int, *, count: int = 2, user: str = "dave") -> Waiter:
    return Waiter(pid, user, Request(count=count, min_free_bytes=20 * GIB))


def sim_source(gpus: int | Path = 4) -> LocalSource:
    """The simulated node at a frozen moment, with fixed host figures."""
    return LocalSource(SimBackend(gpus, clock=lambda: FROZEN_TIME), None, host_stats=lambda: HOST)


class HungSource(Source):
    """A source whose driver never answers."""

    label = "stuck-node"

    def __init__(self) -> None:
        self.release = threading.Event()

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        self.release.wait()
        yield from ()


class QuietSource(Source):
    """A source that says nothing: the test feeds the app's frames itself."""

    def __init__(self, label: str = "node1") -> None:
        self.label = label

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        stop.wait()
        yield from ()


def slurm_jobs(uuids: list[str | None]) -> NodeJobs:
    """Job 1234 of alice on GPUs 0 and 1 (minor numbers 0 and 1), 2 h 13 min 5 s left, GPU 1
    allocated and idle for 20 min; job 1240 of bob on GPU 2, without a time limit."""
    alice = Job("1234", "alice", "train-llm", (0, 1), FROZEN_TIME - 3600, 3600 + 7985.0)
    bob = Job("1240", "bob", "eval", (2,), FROZEN_TIME - 60, None)
    table = JobTable((alice, bob), FROZEN_TIME)
    return NodeJobs(table, None, {uuids[1] or "": 1200.0, uuids[0] or "": 30.0}, 600.0, True)


def fed_app() -> GpuwatchApp:
    """An app with one quiet source, fed frames by the test."""
    return GpuwatchApp([QuietSource()], interval_s=0.1, clock=lambda: FROZEN_TIME, sample=False)


async def until(
    pilot: Pilot[int], condition: Callable[[], object], what: str, *, timeout_s: float = 60
) -> None:
    """Lets the app run until `condition` holds, without a fixed sleep (generous: CI
    machines are slow)."""
    await wait_until_async(condition, what, pause=pilot.pause, timeout_s=timeout_s, interval_s=0.02)


def synced(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A Pilot test, run in an event loop of its own (with its fixtures and parameters)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run
