"""The process table's rows: GPU processes, lease holders and waiting jobs.

Pure: frames in, rows out; sorting, filtering, and which columns fit a width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec
from msgspec.structs import replace

from gpuwatch.models import Lease, ProcessUsage, Snapshot
from gpuwatch.request import Waiter
from gpuwatch.tui.common import render
from gpuwatch.tui.common.columns import CELL_PADDING, Column, fitting, sortable
from gpuwatch.tui.common.frames import Frame
from gpuwatch.tui.common.trends import Idle, IdleClock


class Row(msgspec.Struct, frozen=True):
    """One line of the process table.

    `kind` is the driver's process kind, or `lease` for a holder that uses no
    GPU memory yet, or `waiting` for a `pick --wait` job in line. `None` is unknown.
    """

    key: str
    source: str
    pid: int
    kind: str
    gpu: int | None = None
    user: str | None = None
    gpu_memory_bytes: int | None = None
    cpu_pct: float | None = None
    host_memory_bytes: int | None = None
    started_at: float | None = None
    command: str | None = None
    lease: str = ""
    idle: Idle | None = None
    local: bool = True
    """Whether the process is on this machine (so it can be inspected and signalled)."""
    wants: str = ""
    """What a waiting job asks for."""
    device: str = ""
    """Where it runs, as shown: the GPU's index, or `GPU:MIG` for a MIG device (`0:2`)."""
    branch: str = ""
    """In the tree view, the branch drawn before its command (`├─ `)."""
    sm_util_pct: int | None = None
    """Its share of the GPU's SM utilization, as the driver samples it."""
    job: str = ""
    """The id of the scheduler's job holding its GPU; empty for none (or not known)."""


def _running_order(row: Row) -> float:
    """Orders rows as their running time does: started earlier, running longer; a row with
    no start time (a waiting job) the shortest."""
    return float("-inf") if row.started_at is None else -row.started_at


COLUMNS: tuple[Column[Row], ...] = (
    Column("host", "HOST", 12, lambda r: r.source, 10),
    Column("gpu", "GPU", 5, lambda r: (-1 if r.gpu is None else r.gpu, r.device), 0),
    Column("job", "JOB", 10, lambda r: r.job, 2),
    Column("pid", "PID", 8, lambda r: r.pid, 0),
    Column("user", "USER", 10, lambda r: r.user or "", 0),
    Column("kind", "KIND", 8, lambda r: r.kind, 9),
    Column("gpu_mem", "GPU-MEM", 9, lambda r: sortable(r.gpu_memory_bytes), 0),
    Column("sm", "SM%", 5, lambda r: sortable(r.sm_util_pct), 5),
    Column("cpu", "CPU%", 6, lambda r: sortable(r.cpu_pct), 6),
    Column("host_mem", "HOST-MEM", 10, lambda r: sortable(r.host_memory_bytes), 8),
    Column("time", "TIME", 7, _running_order, 7),
    Column("lease", "LEASE", 18, lambda r: r.lease, 4),
    Column("idle", "IDLE", 8, lambda r: -1.0 if r.idle is None else r.idle.seconds, 3),
    Column("command", "COMMAND", 0, lambda r: r.command or "", 0),
)
COLUMN_KEYS = tuple(column.key for column in COLUMNS)
BY_KEY: Mapping[str, Column[Row]] = {column.key: column for column in COLUMNS}
KIND_SHOWN = {"compute+graphics": "C+G"}
"""Kinds longer than the KIND column, written as nvidia-smi writes them."""
MIN_COMMAND_WIDTH = 16


def columns_for(width: int, *, several_hosts: bool, jobs: bool = False) -> tuple[Column[Row], ...]:
    """The columns that fit `width` cells, dropping the least needed first; JOB only where
    a scheduler says who holds the GPUs (`jobs`)."""
    chosen = [c for c in COLUMNS if (several_hosts or c.key != "host") and (jobs or c.key != "job")]
    return fitting(chosen, width, room_for=MIN_COMMAND_WIDTH + 3)


def column_widths(columns: Sequence[Column[Row]], width: int) -> list[int]:
    """Each column's width; the command takes what the others leave of `width`."""
    fixed = sum(c.width + CELL_PADDING for c in columns if c.key != "command")
    rest = max(MIN_COMMAND_WIDTH, width - fixed - 3)
    return [rest if c.key == "command" else c.width for c in columns]


def build_rows(
    frame: Frame,
    idle_clocks: Mapping[int, IdleClock],
    now: float,
    idle_after_s: float,
    *,
    idle_now: float | None = None,
    idle_offset_s: float = 0.0,
) -> list[Row]:
    """Every process, lease holder and waiting job of one frame, in no particular order.

    `now` is the wall time; the idle clocks may run on another clock (the monotonic one),
    where it is `idle_now` and a wall time `t` of the frame is `t - idle_offset_s`.
    """
    idle = _IdleLookup(idle_clocks, now if idle_now is None else idle_now, idle_offset_s)
    snapshot = frame.snapshot
    if snapshot is None:
        return []
    by_gpu: dict[int, list[Lease]] = {}
    for lease in frame.leases:
        by_gpu.setdefault(lease.gpu_index, []).append(lease)
    labels = device_labels(snapshot)
    holders = job_ids(frame)
    rows = [
        replace(
            _process_row(frame, p, by_gpu.get(p.gpu_index, ()), idle, idle_after_s),
            key=process_key(frame.source, labels(p), p.pid),
            device=labels(p),
            job=holders.get(p.gpu_index, ""),
        )
        for p in snapshot.processes
    ]
    on_gpu = {(p.gpu_index, p.pid) for p in snapshot.processes}
    rows += [
        replace(_lease_row(frame, lease, idle, idle_after_s), job=holders.get(lease.gpu_index, ""))
        for lease in frame.leases
        if (lease.gpu_index, lease.pid) not in on_gpu
    ]
    rows += [_waiter_row(frame, number, waiter) for number, waiter in enumerate(frame.waiters)]
    # A process listed twice for one device (as the driver may) is one row.
    return list({row.key: row for row in reversed(rows)}.values())[::-1]


def job_ids(frame: Frame) -> dict[int, str]:
    """The id of the job holding each GPU of the frame that a job holds, by NVML index."""
    jobs, snapshot = frame.jobs, frame.snapshot
    if jobs is None or jobs.table is None or snapshot is None:
        return {}
    return {gpu.index: job.job_id for gpu in snapshot.gpus if (job := jobs.job_of(gpu))}


def process_key(source: str, device: str, pid: int) -> str:
    """Names a process's row, and its series for the detail graphs."""
    return f"{source}/{device}/{pid}"


def device_labels(snapshot: Snapshot) -> Callable[[ProcessUsage], str]:
    """Where a process runs, as shown: its GPU's index, or `GPU:MIG` (`0:2`)."""
    mig_labels = {mig.uuid: mig.label for mig in snapshot.mig_devices if mig.uuid}
    return lambda p: mig_labels.get(p.mig_uuid or "", str(p.gpu_index))


class _IdleLookup(msgspec.Struct, frozen=True):
    clocks: Mapping[int, IdleClock]
    now: float
    offset_s: float

    def past(self, gpu_index: int, since: float | None, idle_after_s: float) -> Idle | None:
        """How long `gpu_index` has idled since the wall time `since`, once `idle_after_s`."""
        clock = self.clocks.get(gpu_index)
        if clock is None:
            return None
        start = None if since is None else since - self.offset_s
        idle = clock.idle_for(self.now, since=start)
        return idle if idle is not None and idle.seconds >= idle_after_s else None


def _process_row(
    frame: Frame,
    process: ProcessUsage,
    leases: Sequence[Lease],
    idle_lookup: _IdleLookup,
    idle_after_s: float,
) -> Row:
    holds_memory = bool(process.memory_used_bytes)
    idle = (
        idle_lookup.past(process.gpu_index, process.started_at, idle_after_s)
        if holds_memory
        else None
    )
    return Row(
        key="",  # set by the caller, who knows the device
        source=frame.source,
        gpu=process.gpu_index,
        pid=process.pid,
        user=process.user,
        kind=str(process.kind),
        gpu_memory_bytes=process.memory_used_bytes,
        cpu_pct=process.cpu_pct,
        host_memory_bytes=process.rss_bytes,
        started_at=process.started_at,
        command=process.command,
        lease=_lease_cell(process, leases),
        idle=idle,
        local=frame.local,
        sm_util_pct=process.sm_util_pct,
    )


def _lease_cell(process: ProcessUsage, leases: Sequence[Lease]) -> str:
    """`holder` when this process holds the GPU's lease; the lease it runs under when its
    user holds one (a launcher's workers); `outside ...` for anyone else's process, and
    `on ...` where the owner is not visible from here."""
    own = [lease for lease in leases if lease.pid == process.pid]
    if own:
        return "holder " + _how(own[0])
    mine = [lease for lease in leases if process.user is not None and lease.user == process.user]
    if mine:
        return render.lease_summary(mine)
    if not leases:
        return ""
    holders = " + ".join(sorted({lease.user for lease in leases}))
    # A process whose owner cannot be seen (another container) may be the holder's own.
    return f"on {holders}'s lease" if process.user is None else f"outside {holders}'s lease"


def _how(lease: Lease) -> str:
    return "(exclusive)" if lease.mem_bytes is None else f"(--mem {render.size(lease.mem_bytes)})"


def _lease_row(
    frame: Frame,
    lease: Lease,
    idle_lookup: _IdleLookup,
    idle_after_s: float,
) -> Row:
    idle = idle_lookup.past(lease.gpu_index, lease.started_at, idle_after_s)
    return Row(
        key=f"{frame.source}/lease/{lease.lease_id or lease.pid}",
        source=frame.source,
        gpu=lease.gpu_index,
        pid=lease.pid,
        user=lease.user,
        kind="lease",
        started_at=lease.started_at,
        command=lease.command,
        lease="holder " + _how(lease),
        idle=idle,
        local=frame.local,
    )


def _waiter_row(frame: Frame, number: int, waiter: Waiter) -> Row:
    request = waiter.request
    wants = [f"{request.count} GPU" + ("s" if request.count > 1 else "")]
    if request.min_free_bytes is not None:
        wants.append(f"≥{render.size(request.min_free_bytes)} free")
    if request.mem_bytes is not None:
        wants.append(f"--mem {render.size(request.mem_bytes)}")
    if request.max_util_pct is not None:
        wants.append(f"≤{request.max_util_pct:g}% busy")
    text = ", ".join(wants)
    return Row(
        key=f"{frame.source}/wait/{waiter.pid}",
        source=frame.source,
        pid=waiter.pid,
        user=waiter.user,
        kind="waiting",
        command=f"#{number + 1} in line, wants {text}",
        local=frame.local,
        wants=text,
    )


def sort_rows(rows: Iterable[Row], column: str, *, reverse: bool) -> list[Row]:
    """Rows by `column`, ties broken by host, GPU and pid so the order is stable."""
    ordered = sorted(rows, key=lambda r: (r.source, -1 if r.gpu is None else r.gpu, r.pid))
    return sorted(ordered, key=BY_KEY[column].sort_value, reverse=reverse)  # type: ignore[arg-type]


class RowFilter(msgspec.Struct, frozen=True):
    """`user:alice gpu:3 idle text`: every term must match.

    `user:NAME` and `gpu:N` match those fields exactly (`gpu:1,3` several GPUs),
    `idle` keeps idle holders, and any other word must appear in the user,
    pid, command, lease or job id.
    """

    users: frozenset[str] = frozenset()
    gpus: frozenset[int] = frozenset()
    idle_only: bool = False
    words: tuple[str, ...] = ()
    problem: str = ""
    """Terms that were not understood (ignored), for the status line."""

    @classmethod
    def parse(cls, text: str) -> RowFilter:
        users: set[str] = set()
        gpus: set[int] = set()
        words: list[str] = []
        bad: list[str] = []
        idle_only = False
        for term in text.split():
            name, colon, value = term.partition(":")
            if colon and name == "user" and value:
                users.add(value)
            elif colon and name == "gpu" and value:
                numbers = value.split(",")
                if all(n.isdigit() for n in numbers):
                    gpus.update(int(n) for n in numbers)
                else:
                    bad.append(term)
            elif term == "idle":
                idle_only = True
            else:
                words.append(term.lower())
        problem = f"not understood: {' '.join(bad)}" if bad else ""
        return cls(frozenset(users), frozenset(gpus), idle_only, tuple(words), problem)

    def __bool__(self) -> bool:
        return bool(self.users or self.gpus or self.idle_only or self.words)

    def matches(self, row: Row) -> bool:
        if self.users and row.user not in self.users:
            return False
        if self.gpus and row.gpu not in self.gpus:
            return False
        if self.idle_only and row.idle is None:
            return False
        haystack = f"{row.user or ''} {row.pid} {row.command or ''} {row.lease} {row.job}".lower()
        return all(word in haystack for word in self.words)


def cell_text(row: Row, column: Column[Row], now: float, tagged: bool) -> tuple[str, str]:
    """What one cell says, and its style name."""
    key = column.key
    if key == "pid":
        return (f"{'*' if tagged else ' '}{row.pid}", "tagged" if tagged else "")
    text, style = _cell(row, key, now)
    return text, style


def _cell(row: Row, key: str, now: float) -> tuple[str, str]:  # noqa: PLR0911, PLR0912 - one per column
    if key == "host":
        return row.source, ""
    if key == "gpu":
        return (row.device or ("-" if row.gpu is None else str(row.gpu))), ""
    if key == "job":
        return (row.job or "-"), ("" if row.job else "dim")
    if key == "user":
        return (row.user or "?"), ("" if row.user else "dim")
    if key == "kind":
        style = "warn" if row.kind == "waiting" else "lease" if row.kind == "lease" else ""
        return KIND_SHOWN.get(row.kind, row.kind), style
    if key == "gpu_mem":
        return render.size(row.gpu_memory_bytes), ""
    if key in ("sm", "cpu"):
        value = row.sm_util_pct if key == "sm" else row.cpu_pct
        return (render.MISSING if value is None else f"{value:.0f}"), ""
    if key == "host_mem":
        return render.size(row.host_memory_bytes), ""
    if key == "time":
        return render.duration(None if row.started_at is None else now - row.started_at), ""
    if key == "lease":
        return row.lease, "warn" if row.lease.startswith("outside ") else "lease"
    if key == "idle":
        if row.idle is None:
            return "", ""
        prefix = "≥" if row.idle.at_least else ""
        return f"{prefix}{render.duration(row.idle.seconds)}", "alarm"
    if row.command is None:
        return row.branch + "(not visible from here)", "dim"
    return row.branch + row.command, "dim" if row.kind == "parent" else ""
