"""Frames: one machine's state at one moment, and the sources that produce them.

A `Source` runs on a worker thread, never on the UI thread: a driver call
that hangs blocks only that thread, and the screen says how long it has had
no sample. Nothing here imports Textual.
"""

from __future__ import annotations

import abc
import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from gpuwatch.backends.base import Backend
from gpuwatch.errors import GpuwatchError
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import Lease, Snapshot
from gpuwatch.placement.gpus import Waiter
from gpuwatch.sampling.history import GpuSeries
from gpuwatch.sampling.poller import ticks

HISTORY_WINDOW_S = 3600.0
"""How far back the daemon's history is asked for: the graphs and the idle detection."""


@dataclass(frozen=True, slots=True)
class HostStats:
    """The machine's CPU, memory, swap and load, as `top` shows them."""

    cpu_pct: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    load_1m: float
    load_5m: float
    load_15m: float


@dataclass(frozen=True, slots=True)
class Ancestor:
    """What the tree view needs of a process: its parent, owner and name."""

    pid: int
    ppid: int
    user: str | None
    name: str


@dataclass(frozen=True, slots=True)
class Frame:
    """What one source said at one moment.

    `snapshot` is `None` when the source failed as a whole this time; `error` says why.
    """

    source: str
    snapshot: Snapshot | None
    leases: tuple[Lease, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    host: HostStats | None = None
    error: str | None = None
    local: bool = True
    """Whether the processes are on this machine (so they can be inspected and signalled)."""
    ancestors: tuple[Ancestor, ...] = ()
    """The GPU processes and their ancestors, read only while the tree view is on."""


@dataclass(frozen=True, slots=True)
class Backfill:
    """Samples from before the screen opened (the daemon's history), oldest first."""

    source: str
    series: tuple[GpuSeries, ...] = ()
    note: str = ""
    """Where the graphs' past comes from, for the user: 'daemon history, 60m'."""


class Source(abc.ABC):
    """Where one section of the screen gets its frames. Used from one worker thread."""

    label: str
    """The section's name: the machine's host name or the `--host` given."""

    def backfill(self) -> Backfill:
        """Samples from before now, when the source keeps any (read once, at start)."""
        return Backfill(self.label, note="from this screen's samples")

    @abc.abstractmethod
    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        """Frames, one per `interval_s`, until `stop` is set; never raises."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing
        """Releases what the source holds. Safe to call twice."""


def read_host_stats() -> HostStats:
    """This machine's CPU (since the previous call), memory, swap and load, from psutil."""
    import psutil

    memory = psutil.virtual_memory()
    swap = psutil.swap_memory()
    load = os.getloadavg()
    return HostStats(
        cpu_pct=float(psutil.cpu_percent(interval=None)),
        cpu_count=psutil.cpu_count() or 1,
        memory_used_bytes=int(memory.total - memory.available),
        memory_total_bytes=int(memory.total),
        swap_used_bytes=int(swap.used),
        swap_total_bytes=int(swap.total),
        load_1m=load[0],
        load_5m=load[1],
        load_15m=load[2],
    )


@dataclass
class LocalSource(Source):
    """A backend on this machine (daemon, NVML or simulated), its leases and waiting jobs."""

    backend: Backend
    lease_dir: LeaseDir | None = None
    host_stats: Callable[[], HostStats | None] | None = read_host_stats
    label: str = ""
    tree: bool = False
    """Read each process's ancestors too (set while the tree view is shown)."""
    _closed: bool = field(default=False, repr=False)

    def backfill(self) -> Backfill:
        path = getattr(self.backend, "socket_path", None)
        if not isinstance(path, str):
            return super().backfill()
        try:
            series = fetch_history(path, HISTORY_WINDOW_S)
        except (OSError, ValueError) as error:
            return Backfill(self.label, note=f"daemon history unavailable ({error})")
        return Backfill(self.label, tuple(series), note=_span_note(series))

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        for _ in ticks(interval_s, sleep=stop.wait):
            if stop.is_set():
                return
            yield self.read()

    def read(self) -> Frame:
        """One frame now; a failure becomes the frame's `error`."""
        try:
            snapshot = self.backend.sample()
        except Exception as failure:  # a driver that fails as a whole: say so, keep going
            return Frame(self.label, None, error=_describe(failure), host=self._host())
        label = self.label or snapshot.hostname
        leases: tuple[Lease, ...] = ()
        waiters: tuple[Waiter, ...] = ()
        error: str | None = None
        if self.lease_dir is not None:
            try:
                leases = tuple(self.lease_dir.leases())
                waiters = tuple(self.lease_dir.waiting_before(None))
            except GpuwatchError as failure:
                error = f"leases unreadable: {failure}"
        ancestors: tuple[Ancestor, ...] = ()
        if self.tree:
            pids = {p.pid for p in snapshot.processes} | {lease.pid for lease in leases}
            ancestors = read_ancestors(pids)
        return Frame(label, snapshot, leases, waiters, self._host(), error, ancestors=ancestors)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.backend.close()

    def _host(self) -> HostStats | None:
        try:
            return self.host_stats() if self.host_stats is not None else None
        except Exception:  # host statistics are a nicety: their absence is shown as "-"
            return None


@dataclass
class RemoteSource(Source):
    """Another machine, through `gpuwatch status --json --watch` over ssh; reconnects."""

    label: str
    backend: str | None = None
    sim: str | None = None
    retry_s: float = 5.0

    def frames(self, interval_s: float, stop: threading.Event) -> Iterator[Frame]:
        from gpuwatch.backends.ssh import remote_snapshots

        while not stop.is_set():
            try:
                stream = remote_snapshots(
                    self.label,
                    interval_s=interval_s,
                    count=None,
                    backend=self.backend,
                    sim=self.sim,
                )
                for snapshot, leases in stream:
                    yield Frame(self.label, snapshot, tuple(leases), local=False)
                    if stop.is_set():
                        return
                error = "the remote stream ended"
            except Exception as failure:  # unreachable, no gpuwatch there, garbled output
                error = _describe(failure)
            yield Frame(
                self.label, None, error=f"{error}; retrying in {self.retry_s:g}s", local=False
            )
            stop.wait(self.retry_s)


def read_ancestors(pids: set[int], proc: str = "/proc", limit: int = 4096) -> tuple[Ancestor, ...]:
    """Each of `pids` and its ancestors below init, from /proc; unreadable ones are left out."""
    from gpuwatch.leases.directory import user_name

    found: dict[int, Ancestor] = {}
    for start in pids:
        pid = start
        while pid > 1 and pid not in found and len(found) < limit:
            try:
                with open(f"{proc}/{pid}/stat", "rb") as stat_file:
                    stat = stat_file.read(4096).decode(errors="replace")
                uid = os.stat(f"{proc}/{pid}").st_uid
                ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                break  # gone, hidden, or in another PID namespace
            name = stat[stat.find("(") + 1 : stat.rfind(")")]
            found[pid] = Ancestor(pid, ppid, user_name(uid), name)
            pid = ppid
    return tuple(found.values())


def fetch_history(socket_path: str, window_s: float) -> list[GpuSeries]:
    """The daemon's per-GPU history for the last `window_s`, checked field by field."""
    from gpuwatch.backends.daemon_client import http_get

    status, body = http_get(socket_path, f"/v1/history?last={window_s:g}")
    if status != 200:
        raise ValueError(f"HTTP {status}")
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("not a history answer")
    return [series for item in data["gpus"] if (series := parse_series(item)) is not None]


def parse_series(item: object) -> GpuSeries | None:
    """A `GpuSeries` from the daemon's JSON, or `None` when anything is off."""
    if not isinstance(item, dict):
        return None
    index, times = item.get("index"), item.get("taken_at")
    memory, utilization = item.get("memory_used_bytes"), item.get("utilization_pct")
    if not (isinstance(index, int) and 0 <= index < 1024):
        return None
    columns = (times, memory, utilization)
    if not all(isinstance(column, list) for column in columns):
        return None
    assert isinstance(times, list) and isinstance(memory, list) and isinstance(utilization, list)
    if not len(times) == len(memory) == len(utilization):
        return None
    if not all(_finite(t) for t in times):
        return None
    uuid = item.get("uuid")
    return GpuSeries(
        index=index,
        uuid=uuid if isinstance(uuid, str) else None,
        taken_at=[float(t) for t in times],
        memory_used_bytes=[_int_or_none(v, 1 << 50) for v in memory],
        utilization_pct=[_int_or_none(v, 100) for v in utilization],
        temperature_c=[None] * len(times),
        power_w=[None] * len(times),
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_or_none(value: object, maximum: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum:
        return value
    return None


def _span_note(series: Sequence[GpuSeries]) -> str:
    times = series[0].taken_at if series else []
    if len(times) < 2:
        return "daemon has no history yet"
    minutes = (times[-1] - times[0]) / 60
    return f"from the daemon's history ({minutes:.0f} min)"


def _describe(error: BaseException) -> str:
    return str(error) if isinstance(error, GpuwatchError) else f"{type(error).__name__}: {error}"
