"""Which GPUs a job gets: filters and ranking, as a pure function of what is known.

`choose()` takes a snapshot, the leases in force and the jobs waiting ahead in
line, and returns the GPUs to give and, for every other GPU, one line saying
why not. No I/O happens here; `gpuwatch.placement.acquire` gathers the inputs.

Without `--mem` (or `allow_busy`), a job is given only GPUs nobody uses:
no other job's compute process, no graphics process beyond a small allowance,
little memory in use, and no recent utilization (`in_use()`, which the MIG
policy calls too).

A job waiting ahead keeps the GPUs it could use from jobs behind it, so that
small jobs do not starve a large one. Since anyone can join the line, that is
bounded: only each user's first job in line keeps GPUs, only for
`KEEP_LIMIT_S`, and only when this node could ever meet its request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpuwatch.models import GpuSample, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.placement.choices import Strategy
from gpuwatch.placement.request import Request, Waiter
from gpuwatch.units import format_size

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    pass

_GIB = 1 << 30
KEEP_LIMIT_S = 1800.0
"""How long a waiting job keeps GPUs from later jobs; after that it waits as their equal."""
GRAPHICS_ALLOWANCE_BYTES = 256 << 20
"""A graphics process using at most this much (Xorg, a desktop) does not make a GPU in use."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The outcome: `chosen` best first (empty unless all `count` qualify), and why not the rest."""

    chosen: tuple[GpuSample, ...]
    reasons: tuple[str, ...]
    qualifying: int = 0
    in_use: int = 0
    """How many were left out only because they are in use (see `in_use()`)."""

    @property
    def satisfied(self) -> bool:
        return bool(self.chosen)


class _Candidate:
    """A GPU as a candidate: its free memory net of promises, its leases and its processes."""

    __slots__ = (
        "free_bytes",
        "gpu",
        "held_alone",
        "leases",
        "own_pids",
        "processes",
        "recent_util_pct",
        "twin",
    )

    def __init__(self, gpu: GpuSample) -> None:
        self.gpu = gpu
        self.free_bytes = 0
        self.leases: list[Lease] = []
        self.processes: list[ProcessUsage] = []
        self.own_pids: frozenset[int] = frozenset()
        self.held_alone = False
        """Leased to the asking job alone: whatever runs there is its own."""
        self.recent_util_pct: float | None = None
        self.twin: int | None = None
        """Another GPU reporting the same UUID, if any."""


def choose(
    snapshot: Snapshot,
    request: Request,
    *,
    leases: Sequence[Lease] = (),
    mine: frozenset[str] = frozenset(),
    own_pids: frozenset[int] = frozenset(),
    recent_util_pct: Mapping[str, float] | None = None,
    waiting_ahead: Sequence[Waiter] = (),
    seed: int = 0,
) -> Choice:
    """Chooses `request.count` GPUs, or says for each GPU why it cannot be had.

    Leases whose ids are in `mine` belong to the job asking (it runs under
    them), so they do not keep it from their GPUs; they do keep waiters off.
    The processes of those leases and `own_pids` (the job's other processes)
    do not make a GPU in use for it. `recent_util_pct` is each GPU's (by UUID)
    highest utilization over the last minute, where known. `seed` breaks ties
    between equally good GPUs; giving each process its own (its pid) spreads
    jobs started together over equal GPUs.
    """
    own = own_pids | {lease.pid for lease in leases if lease.lease_id in mine}
    recent = recent_util_pct or {}
    everyone = _candidates(snapshot, leases, frozenset(), frozenset(), recent)
    kept: dict[int, Waiter] = {}
    for waiter in keepers(waiting_ahead, mig=False):
        if not _could_ever_serve(snapshot, waiter.request):
            continue
        ranked, _, _ = _qualify(everyone, waiter.request, kept, waiter.pid)
        for candidate in ranked[: waiter.request.count]:
            kept[candidate.gpu.index] = waiter
    others = [lease for lease in leases if lease.lease_id not in mine]
    alone = frozenset(
        lease.gpu_uuid for lease in leases if lease.lease_id in mine and lease.exclusive
    )
    candidates = _candidates(snapshot, others, own, alone, recent) if own else everyone
    ranked, rejected, busy = _qualify(candidates, request, kept, seed)
    if len(ranked) >= request.count:
        chosen = tuple(candidate.gpu for candidate in ranked[: request.count])
        return Choice(chosen, tuple(rejected.values()), len(ranked), busy)
    for candidate in ranked:
        rejected[candidate.gpu.index] = (
            f"GPU {candidate.gpu.index}: qualifies ({format_size(candidate.free_bytes)} free)"
        )
    reasons = tuple(rejected[index] for index in sorted(rejected))
    return Choice((), reasons, len(ranked), busy)


def keepers(waiting_ahead: Sequence[Waiter], *, mig: bool) -> Iterator[Waiter]:
    """The waiters ahead that may keep devices of their kind (MIG devices with `mig`, else
    whole GPUs): each user's first in line, for `KEEP_LIMIT_S`."""
    users: set[str] = set()
    for waiter in waiting_ahead:
        if (waiter.request.mig is not None) is not mig or waiter.user in users:
            continue
        users.add(waiter.user)
        if waiter.waited_s <= KEEP_LIMIT_S:
            yield waiter


def enough_could_fit(totals_bytes: Iterable[int | None], request: Request) -> bool:
    """Whether enough of the devices of these sizes (`None`: unknown, which might) could
    serve `request` once idle: what a waiter must pass to keep devices from later jobs,
    GPUs or MIG devices alike."""
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    big_enough = sum(1 for total in totals_bytes if total is None or total >= needed)
    return big_enough >= request.count


def _could_ever_serve(snapshot: Snapshot, request: Request) -> bool:
    return enough_could_fit(
        (
            gpu.memory_total_bytes
            for gpu in snapshot.gpus
            if (request.allowed is None or gpu.index in request.allowed)
            and gpu.index not in request.excluded
            and not gpu.mig_enabled
        ),
        request,
    )


def in_use(
    processes: Iterable[ProcessUsage],
    used_bytes: int | None,
    utilization_pct: float | None,
    request: Request,
    *,
    own_pids: frozenset[int] = frozenset(),
    recent_util_pct: float | None = None,
) -> str | None:
    """Why a GPU or MIG device is in use for `request`, or `None` when it is not.

    For a job that wants an idle device (`Request.wants_idle`), any compute
    process of another job makes it in use, and so does a graphics process
    using more than `GRAPHICS_ALLOWANCE_BYTES`. Memory in use and utilization
    count against the limits the request sets (or its defaults). The job's own
    processes (`own_pids`) count for nothing: their memory is not counted, and
    utilization is theirs while they run there.
    """
    mine = [p for p in processes if p.pid in own_pids]
    others = [p for p in processes if p.pid not in own_pids and _occupies(p)]
    if used_bytes is not None:
        used_bytes = max(0, used_bytes - sum(p.memory_used_bytes or 0 for p in mine))
    busy_pct = _busiest(utilization_pct, recent_util_pct) if not mine else None
    if others and request.wants_idle:
        return _in_use_by(others, used_bytes, utilization_pct)
    used_limit = request.used_limit_bytes
    if used_limit is not None and used_bytes is not None and used_bytes > used_limit:
        flag = "--max-used" if request.max_used_bytes is not None else "default; see --max-used"
        return f"in use: {format_size(used_bytes)} used > {format_size(used_limit)} ({flag})"
    util_limit = request.util_limit_pct
    if request.max_util_pct is not None and utilization_pct is None and not mine:
        return "utilization unknown"
    if util_limit is not None and busy_pct is not None and busy_pct > util_limit:
        when = "" if busy_pct == utilization_pct else " in the last minute"
        flag = "--max-util" if request.max_util_pct is not None else "default; see --max-util"
        return f"in use: {busy_pct:g}% busy{when} > {util_limit:g}% ({flag})"
    return None


def _occupies(process: ProcessUsage) -> bool:
    if process.kind is not ProcessKind.GRAPHICS:
        return True
    return (process.memory_used_bytes or 0) > GRAPHICS_ALLOWANCE_BYTES


def _busiest(now_pct: float | None, recent_pct: float | None) -> float | None:
    known = [value for value in (now_pct, recent_pct) if value is not None]
    return max(known) if known else None


def _in_use_by(
    others: list[ProcessUsage], used_bytes: int | None, utilization_pct: float | None
) -> str:
    """`in use by svc-infer, pids 40500 40501, 36.0GiB used, 48% busy` (`in use by pid 7`
    where the user cannot be told: another PID namespace, or the host was not asked)."""
    users = sorted({p.user for p in others if p.user})
    pids = sorted({p.pid for p in others})
    who = f"{_first(users, 3, ', ')}, " if users else ""
    parts = [f"in use by {who}{'pid' if len(pids) == 1 else 'pids'} {_first(pids, 6, ' ')}"]
    if used_bytes is not None:
        parts.append(f"{format_size(used_bytes)} used")
    if utilization_pct is not None:
        parts.append(f"{utilization_pct:g}% busy")
    return ", ".join(parts)


def _first(items: Sequence[object], most: int, separator: str) -> str:
    """The first `most` items, and `...` when there are more: a reason stays one line."""
    return separator.join(str(item) for item in items[:most]) + (
        " ..." if len(items) > most else ""
    )


def _candidates(
    snapshot: Snapshot,
    leases: Iterable[Lease],
    own_pids: frozenset[int],
    own_gpus: frozenset[str],
    recent_util_pct: Mapping[str, float],
) -> list[_Candidate]:
    seen: dict[str, int] = {}
    twins: dict[int, int] = {}
    for gpu in snapshot.gpus:
        if gpu.uuid and (first := seen.setdefault(gpu.uuid, gpu.index)) != gpu.index:
            twins[gpu.index], twins[first] = first, gpu.index
    # Two GPUs with one UUID are both in error: no lease can tell which of them it is for.
    by_uuid = {
        gpu.uuid: _Candidate(gpu) for gpu in snapshot.gpus if gpu.uuid and gpu.index not in twins
    }
    for lease in leases:
        if lease.gpu_uuid in by_uuid:
            by_uuid[lease.gpu_uuid].leases.append(lease)
    used_by_pid: dict[tuple[int, int], int] = {}
    processes: dict[int, list[ProcessUsage]] = {}
    for process in snapshot.processes:
        key = (process.gpu_index, process.pid)
        used_by_pid[key] = used_by_pid.get(key, 0) + (process.memory_used_bytes or 0)
        processes.setdefault(process.gpu_index, []).append(process)
    candidates = []
    for gpu in snapshot.gpus:
        candidate = by_uuid.get(gpu.uuid) if gpu.uuid else None
        candidate = candidate or _Candidate(gpu)
        # Memory a shared lease declared but its holder has not allocated yet is promised.
        promised = sum(
            max(0, (lease.mem_bytes or 0) - used_by_pid.get((gpu.index, lease.pid), 0))
            for lease in candidate.leases
        )
        candidate.free_bytes = (gpu.memory_free_bytes or 0) - promised
        candidate.processes = processes.get(gpu.index, [])
        candidate.own_pids = own_pids
        # Even its processes in another PID namespace, which no pid tells.
        candidate.held_alone = gpu.uuid in own_gpus
        candidate.recent_util_pct = recent_util_pct.get(gpu.uuid) if gpu.uuid else None
        candidate.twin = twins.get(gpu.index)
        candidates.append(candidate)
    return candidates


def _qualify(
    candidates: list[_Candidate], request: Request, kept: Mapping[int, Waiter], seed: int
) -> tuple[list[_Candidate], dict[int, str], int]:
    qualifying, rejected, busy = [], {}, 0
    for candidate in candidates:
        reason = _reason_against(candidate, request, kept)
        if reason is None:
            qualifying.append(candidate)
        else:
            busy += reason.startswith("in use")
            rejected[candidate.gpu.index] = f"GPU {candidate.gpu.index}: {reason}"
    qualifying.sort(key=lambda candidate: _rank(candidate, request.strategy, seed))
    return qualifying, rejected, busy


def _reason_against(
    candidate: _Candidate, request: Request, kept: Mapping[int, Waiter]
) -> str | None:
    """Why `candidate` cannot serve `request`, or `None` when it can."""
    for check in (_outside_request, _split_by_mig, _unreadable, _held, _in_use, _too_full):
        if (reason := check(candidate, request, kept)) is not None:
            return reason
    return None


def _outside_request(
    candidate: _Candidate, request: Request, _: Mapping[int, Waiter]
) -> str | None:
    if request.allowed is not None and candidate.gpu.index not in request.allowed:
        return "not in CUDA_VISIBLE_DEVICES"
    return "excluded" if candidate.gpu.index in request.excluded else None


def _split_by_mig(candidate: _Candidate, _: Request, __: Mapping[int, Waiter]) -> str | None:
    if candidate.gpu.mig_enabled:
        return "MIG enabled: it is given out only as MIG devices (use --mig PROFILE|any)"
    return None


def _unreadable(candidate: _Candidate, _: Request, __: Mapping[int, Waiter]) -> str | None:
    gpu = candidate.gpu
    if gpu.error is not None:
        return f"error: {gpu.error}"
    if candidate.twin is not None:
        return f"error: the driver reports the same UUID for GPU {candidate.twin}"
    if gpu.memory_free_bytes is None or gpu.uuid is None:
        return "free memory unknown"
    return memory_nonsense(gpu.memory_total_bytes, gpu.memory_used_bytes, gpu.memory_free_bytes)


def memory_nonsense(total: int | None, used: int | None, free: int | None) -> str | None:
    """`free memory unknown (...)` when the driver's memory figures cannot be true: more
    used or free than exists (a wrapped-around counter). Such a device is never chosen."""
    if total is None:
        return None
    for name, value in (("free", free), ("used", used)):
        if value is not None and not 0 <= value <= total:
            return (
                f"free memory unknown (the driver reports {format_size(value)} {name} "
                f"of {format_size(total)})"
            )
    return None


def _held(candidate: _Candidate, request: Request, kept: Mapping[int, Waiter]) -> str | None:
    if reason := lease_conflict(candidate.leases, shared=request.mem_bytes is not None):
        return reason
    if (waiter := kept.get(candidate.gpu.index)) is not None:
        return f"kept for pid {waiter.pid} ({waiter.user}), which asked earlier"
    return None


def _in_use(candidate: _Candidate, request: Request, _: Mapping[int, Waiter]) -> str | None:
    gpu = candidate.gpu
    if candidate.held_alone:
        return None
    return in_use(
        candidate.processes,
        gpu.memory_used_bytes,
        gpu.utilization_pct,
        request,
        own_pids=candidate.own_pids,
        recent_util_pct=candidate.recent_util_pct,
    )


def _too_full(candidate: _Candidate, request: Request, _: Mapping[int, Waiter]) -> str | None:
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    if candidate.free_bytes >= needed:
        return None
    promised = (candidate.gpu.memory_free_bytes or 0) - candidate.free_bytes
    note = f" after {format_size(promised)} promised to shared leases" if promised else ""
    return f"{format_size(max(0, candidate.free_bytes))} free{note} < {format_size(needed)}"


def lease_conflict(leases: list[Lease], *, shared: bool) -> str | None:
    """Why `leases` keep a job off their GPU (or MIG device), or `None` when they do not."""
    holder = next((lease for lease in leases if lease.exclusive), None)
    if holder is None and leases and not shared:
        holder = leases[0]
    if holder is None:
        return None
    others = f" and {len(leases) - 1} more" if len(leases) > 1 else ""
    how = "leased" if holder.exclusive else "shared"
    return f"{how} by pid {holder.pid} ({holder.user}){others}"


def _rank(candidate: _Candidate, strategy: Strategy, seed: int) -> tuple[float, ...]:
    free_gib = candidate.free_bytes // _GIB  # GPUs within a GiB of each other count as equal
    utilization = candidate.gpu.utilization_pct
    busy = 100.0 if utilization is None else float(utilization)
    tie = _tie_breaker(seed, candidate.gpu.index)
    if strategy is Strategy.LEAST_UTIL:
        return (busy, -free_gib, tie)
    if strategy is Strategy.PACK:
        return (free_gib, busy, tie)
    return (-free_gib, len(candidate.leases), busy, tie)


def _tie_breaker(seed: int, index: int) -> float:
    """A fixed shuffle of GPU indices per seed (Knuth's multiplicative hash)."""
    return ((seed * 2654435761 + index * 40503) * 2246822519 & 0xFFFFFFFF) / 2**32
