"""The fleet table's rows: one per node, the totals above them, and the users view.

Pure: a `FleetState` in, rows out, in one pass over the nodes (each node's work is
bounded by its own GPUs and processes), so 1,000 nodes cost a thousand times one.
Whether a GPU is free is `pick`'s own rule, not a copy of it: a GPU is free when a
plain `gpuwatch pick` (one whole GPU, exclusive) would take it there: no lease on it,
no other job's compute process where processes are known, no scheduler's job or
Kubernetes pod holding it, at most 1 GiB in use and 5 % busy, not split into MIG devices,
readable. A node that is down or stale has no free GPU. A node is keyed by its label
(`gpu-07@10.0.0.7:9400` where several targets claim `gpu-07`); a pod counts as a user,
shown `(namespace/pod)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import msgspec

from gpuwatch.fleet_model import Exporter, FleetState, NodeState, NodeSummary
from gpuwatch.holders import Holders
from gpuwatch.models import GpuSample, Lease, Snapshot
from gpuwatch.placement.gpus import choose
from gpuwatch.request import Request
from gpuwatch.tui.common.trends import IDLE_UTILIZATION_PCT, IdleClock

_PLAIN_PICK = Request()

IdleFor = Callable[[str, GpuSample], float | None]
"""How long the screen has seen a node's GPU idle (seconds), or `None`: not idle, or not
watched long enough to say."""


class NodeRow(msgspec.Struct, frozen=True):
    """One node as its row shows it; `None` is unknown (never zero)."""

    node: str
    up: bool
    has_data: bool
    """False for a node never read: it has no GPUs to show."""
    data_at: float | None
    """When its newest data was taken (Unix time): its age is shown at each drawing."""
    error: str | None
    exporter: str | None
    gpus: int | None = None
    gpus_free: int | None = None
    """`None` on a node that is not up: nothing there counts as free."""
    most_free_bytes: int | None = None
    """The most free memory on one device a job could be given (a GPU, or a MIG device)."""
    memory_free_bytes: int | None = None
    utilization_pct: float | None = None
    """Its GPUs' mean utilization."""
    hottest_c: int | None = None
    power_w: float | None = None
    leases: int | None = None
    """`None` where the node runs another exporter, which tells no leases."""
    idle_held: int | None = None
    """GPUs held (a lease, a process holding memory, or a scheduler's job) but idle."""
    lease_waiters: int | None = None
    """Jobs waiting in line for its GPUs; `None` where its exporter does not tell."""
    longest_wait_s: float | None = None
    jobs: int | None = None
    """The scheduler's jobs holding its GPUs; `None` where they are unknown."""
    idle_allocated: int | None = None
    """GPUs a job holds but leaves idle; `None` where jobs are unknown."""
    users: frozenset[str] | None = frozenset()
    """Who runs a process or a job there; `None` while not known yet (warming up)."""
    models: str = ""
    """Its GPU models, for the filter."""
    warming: bool = False
    """Up, but what Prometheus computes of it is not all known yet (its users, or its idle
    holders: Prometheus holds less than their window of its data)."""
    simulated: bool = False
    """Its GPUs are made up (a daemon serving a simulated node): its name says so."""
    claimed_by: int = 1
    """How many targets claim the node's name (`NodeState.claims`)."""

    @property
    def key(self) -> str:
        return self.node

    @property
    def shown_name(self) -> str:
        """The node's label as its row shows it: `gpu-01 (simulated)` for a simulated one;
        `gpu-07@10.0.0.7:9400 (2 targets claim gpu-07)` where several claim its name."""
        note = " (simulated)" if self.simulated else ""
        if self.claimed_by > 1:
            note += f" ({self.claimed_by} targets claim {self.node.rpartition('@')[0]})"
        return self.node + note


class Totals(msgspec.Struct, frozen=True):
    """The line above the table."""

    nodes_up: int
    nodes_down: int
    gpus: int
    gpus_free: int
    memory_free_bytes: int
    utilization_pct: float | None
    warming: int = 0
    """Nodes up whose figures from Prometheus are not all known yet."""


_FreeHeld = tuple[Snapshot, tuple[Lease, ...] | None, Holders, int]
"""A node's GPUs, leases and holders, and how many of its GPUs were free with them."""
_UsersHeld = tuple[tuple[tuple[str, int, int], ...] | None, frozenset[str] | None]
"""A node's users as its figures tell them, and the set of their names."""


def free_gpus(node: NodeState, snapshot: Snapshot) -> int:
    """How many GPUs a plain `gpuwatch pick` would take there: `pick`'s own rule, with the
    GPUs a scheduler's job or a pod holds, or whose holders are unknown, never free."""
    holders = node.holders
    return choose(snapshot, _PLAIN_PICK, leases=node.leases or (), holders=holders).qualifying


class RowMemory:
    """What a read's rows computed, kept for the next read where a node did not change: a
    node's data changes when it is scraped, far less often than the screen reads. A node
    read GPU by GPU keeps its free GPUs by `pick`'s rule (most of what its row costs)
    while its GPUs and leases stay the same; a node keeps the set of its users while its
    figures tell the very same; and a node that is the very same as at the last read (not
    scraped since, `NodeState`) keeps its row; a row of its GPUs while as many of them
    have been idle long enough by the screen's watch. Only the nodes of the latest read
    are kept."""

    def __init__(self) -> None:
        self._known: dict[str, _FreeHeld] = {}
        self._seen: dict[str, _FreeHeld] = {}
        self._users: dict[str, _UsersHeld] = {}
        self._users_seen: dict[str, _UsersHeld] = {}
        self._rows: dict[str, tuple[NodeState, object, NodeRow]] = {}
        self._rows_seen: dict[str, tuple[NodeState, object, NodeRow]] = {}

    def row(self, node: NodeState, make: Callable[[], NodeRow], watched: object = None) -> NodeRow:
        """`node`'s row: as made at the last read where `node` is the very same, and what
        the screen `watched` of it over time is equal, else made now."""
        held = self._rows.get(node.label)
        if held is None or held[0] is not node or held[1] != watched:
            held = (node, watched, make())
        self._rows_seen[node.label] = held
        return held[2]

    def free(self, node: NodeState, snapshot: Snapshot) -> int:
        known = self._known.get(node.label)
        if (
            known is not None
            and known[0] == snapshot
            and known[1] == node.leases
            and known[2] == node.holders
        ):
            self._seen[node.label] = known
            return known[3]
        free = free_gpus(node, snapshot)
        self._seen[node.label] = (snapshot, node.leases, node.holders, free)
        return free

    def users(self, node: str, figures: NodeSummary) -> frozenset[str] | None:
        held = self._users.get(node)
        if held is None or held[0] is not figures.users:
            held = (figures.users, _user_names(figures))
        self._users_seen[node] = held
        return held[1]

    def forget_unseen(self) -> None:
        """Keeps only the nodes seen since the last call."""
        self._known, self._seen = self._seen, {}
        self._users, self._users_seen = self._users_seen, {}
        self._rows, self._rows_seen = self._rows_seen, {}


def build_rows(
    fleet: FleetState,
    idle_for: IdleFor | None = None,
    idle_after_s: float = 0.0,
    memory: RowMemory | None = None,
) -> list[NodeRow]:
    """One row per node, in the fleet's order. A held GPU is an idle holder when it is idle
    now, or, given `idle_for`, when the screen has seen it idle for `idle_after_s`.
    `memory` keeps what the rows of nodes whose data did not change computed last read
    (without it, everything is computed afresh)."""
    memory = RowMemory() if memory is None else memory
    rows = [node_row(node, idle_for, idle_after_s, memory) for node in fleet.nodes]
    memory.forget_unseen()
    return rows


def node_row(
    node: NodeState, idle_for: IdleFor | None, idle_after_s: float, memory: RowMemory
) -> NodeRow:
    """`node`'s row from its figures (`NodeState.figures`), kept by `memory` while the node
    is the very same. Where its GPUs are at hand, the screen works out what its figures
    leave unknown: the GPUs a plain pick would take, by pick's rule, and its held GPUs
    idle long enough, by what it saw of them over time (`idle_for`); its row is then kept
    while as many of them have been idle long enough."""
    snapshot = node.snapshot
    watched = None
    if snapshot is not None:
        gpus = [gpu for gpu in snapshot.gpus if gpu.error is None]
        watched = (
            _idle_held(node, gpus, idle_for, idle_after_s),
            _idle_allocated(node, gpus, idle_for, idle_after_s),
        )
    return memory.row(node, lambda: _made_row(node, watched, memory), watched)


def _made_row(
    node: NodeState, watched: tuple[int | None, int | None] | None, memory: RowMemory
) -> NodeRow:
    """The row made afresh: `watched`, the screen's own count of the held GPUs and of its
    jobs' GPUs idle long enough, where its GPUs are at hand."""
    figures = node.figures
    if figures is None:
        return _never_read(node)
    idle = (figures.idle_held, figures.idle_allocated)
    if watched is not None:
        idle = (
            watched[0] if idle[0] is None else idle[0],
            watched[1] if idle[1] is None else idle[1],
        )
    free = None
    if node.up:
        free = figures.gpus_free
        if free is None and node.snapshot is not None:
            free = memory.free(node, node.snapshot)
    return _read_row(node, figures, free, idle, memory.users(node.label, figures))


def _read_row(
    node: NodeState,
    figures: NodeSummary,
    free: int | None,
    idle: tuple[int | None, int | None],
    users: frozenset[str] | None,
) -> NodeRow:
    """The row of a node that was read: its `figures`, the GPUs a plain pick would take
    there (`free`), its held GPUs and its jobs' GPUs idle long enough (`idle`)."""
    return NodeRow(
        node.label,
        node.up,
        True,
        node.data_at,
        node.error,
        _exporter(node),
        gpus=figures.gpus,
        gpus_free=free,
        most_free_bytes=figures.most_free_bytes,
        memory_free_bytes=figures.memory_free_bytes,
        utilization_pct=figures.utilization_pct,
        hottest_c=figures.hottest_c,
        power_w=figures.power_w,
        leases=figures.leases,
        idle_held=idle[0],
        lease_waiters=node.lease_waiters,
        longest_wait_s=node.longest_wait_s,
        jobs=figures.jobs,
        idle_allocated=idle[1],
        users=users,
        models=" ".join(figures.models),
        # up, but Prometheus has not yet computed all it tells of the node
        warming=node.up and (users is None or (idle[0] is None and node.snapshot is None)),
        simulated=figures.simulated,
        claimed_by=node.claims,
    )


def _user_names(figures: NodeSummary) -> frozenset[str] | None:
    if figures.users is None:
        return None
    return frozenset(user for user, _, _ in figures.users if user)


def _never_read(node: NodeState) -> NodeRow:
    return NodeRow(
        node.label,
        node.up,
        False,
        node.data_at,
        node.error,
        _exporter(node),
        simulated=node.simulated,
        claimed_by=node.claims,
    )


def _exporter(node: NodeState) -> str | None:
    return None if node.exporter is None else str(node.exporter)


def _idle_held(
    node: NodeState, gpus: list[GpuSample], idle_for: IdleFor | None, idle_after_s: float
) -> int | None:
    """Held GPUs (leased, a process holds memory, or a job holds it) idle for `idle_after_s`;
    `None` where neither leases, processes nor jobs are told."""
    snapshot = node.snapshot
    assert snapshot is not None
    if node.leases is None and not snapshot.processes and node.jobs is None and not node.pods:
        return None
    leased = {lease.gpu_uuid for lease in node.leases or ()}
    holding = {p.gpu_index for p in snapshot.processes if p.memory_used_bytes}
    holding |= {job.gpu_index for job in node.jobs or ()}
    holding |= {pod.gpu_index for pod in node.pods}
    held = [gpu for gpu in gpus if gpu.uuid in leased or gpu.index in holding]
    return sum(_idle_enough(node, gpu, idle_for, idle_after_s) for gpu in held)


def _idle_allocated(
    node: NodeState, gpus: list[GpuSample], idle_for: IdleFor | None, idle_after_s: float
) -> int | None:
    if node.jobs is None:
        return None
    allocated = {job.gpu_index for job in node.jobs}
    return sum(
        _idle_enough(node, gpu, idle_for, idle_after_s) for gpu in gpus if gpu.index in allocated
    )


def _idle_enough(
    node: NodeState, gpu: GpuSample, idle_for: IdleFor | None, idle_after_s: float
) -> bool:
    """Idle for `idle_after_s` by the screen's own watch (`idle_for`; without it: idle now),
    or by the node's daemon, which has watched a job's GPU since the job left it idle."""
    if idle_for is not None:
        seen = idle_for(node.label, gpu)
    else:
        util = gpu.utilization_pct
        seen = 0.0 if util is not None and util <= IDLE_UTILIZATION_PCT else None
    told = [job.allocated_idle_s for job in node.jobs_on(gpu.index) if job.allocated_idle_s]
    longest = max([*told, *([] if seen is None else [seen])], default=None)
    return longest is not None and longest >= idle_after_s


def totals(rows: Iterable[NodeRow]) -> Totals:
    """Nodes up and down (stale counts as down), and the GPUs of the nodes that are up."""
    up = down = gpus = free = memory = warming = 0
    busy_sum, busy_count = 0.0, 0
    for row in rows:
        if not row.up:
            down += 1
            continue
        up += 1
        warming += row.warming
        gpus += row.gpus or 0
        free += row.gpus_free or 0
        memory += row.memory_free_bytes or 0
        if row.utilization_pct is not None and row.gpus:
            busy_sum += row.utilization_pct * row.gpus
            busy_count += row.gpus
    mean = busy_sum / busy_count if busy_count else None
    return Totals(up, down, gpus, free, memory, mean, warming)


class UserRow(msgspec.Struct, frozen=True):
    """One user across the fleet: on how many nodes and GPUs, with how much GPU memory."""

    user: str
    nodes: int
    gpus: int
    memory_bytes: int
    jobs: int = 0
    """The scheduler's jobs of theirs holding GPUs, where nodes tell them."""


class UsersSeen(NamedTuple):
    """The users view: one row per user, and the nodes up whose users it cannot count."""

    rows: list[UserRow]
    silent: int
    """Nodes that tell no processes (another exporter than gpuwatch's)."""
    unknown: int
    """Nodes whose users Prometheus has not told yet (warming up): left out of the rows."""


def user_rows(fleet: FleetState) -> UsersSeen:
    """Users by GPU memory held, most first, from the processes and jobs of nodes that are
    up; how many nodes that are up tell no processes (another exporter), and how many
    have users not known yet."""
    gpus: dict[str, set[tuple[str, int]]] = {}
    memory: dict[str, int] = {}
    jobs: dict[str, set[tuple[str, str]]] = {}
    silent = unknown = 0
    for node in fleet.nodes:
        figures = node.figures
        if not node.up or figures is None:
            continue
        if figures.users is None:
            unknown += 1
            continue
        if node.exporter is not Exporter.GPUWATCH and not figures.users:
            silent += 1
        for user, count, size in figures.users:
            name = user or "?"
            # GPUs by count alone: stand-ins that no GPU index can equal
            gpus.setdefault(name, set()).update((node.label, -1 - n) for n in range(count))
            memory[name] = memory.get(name, 0) + size
        for job in node.jobs or ():
            jobs.setdefault(job.user or "?", set()).add((node.label, job.job_id))
    rows = [
        UserRow(
            user,
            len({name for name, _ in held}),
            len(held),
            memory.get(user, 0),
            len(jobs.get(user, ())),
        )
        for user, held in gpus.items()
    ]
    rows.sort(key=lambda row: (-row.memory_bytes, row.user))
    return UsersSeen(rows, silent, unknown)


def rows_by_key(rows: Iterable[NodeRow]) -> Mapping[str, NodeRow]:
    return {row.key: row for row in rows}


class IdleTracker:
    """How long each GPU of the fleet has been idle, as the screen saw it: one `IdleClock`
    per GPU of the nodes that are up, the GPUs of nodes gone or down forgotten, so what is
    kept is bounded by the fleet, whatever the run time."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeState, dict[str, IdleClock]]] = {}
        """Each node's clocks by GPU, with the node last observed."""
        self._now = 0.0

    def observe(self, fleet: FleetState, now: float) -> None:
        """Notes each GPU's utilization at `now` (a monotonic time). A node that is the
        very same as at the last read (not scraped since) tells nothing new: its clocks
        stand as they are."""
        seen: dict[str, tuple[NodeState, dict[str, IdleClock]]] = {}
        for node in fleet.nodes:
            if not node.up or node.snapshot is None:
                continue
            held = self._nodes.get(node.label)
            if held is not None and held[0] is node:
                seen[node.label] = held
                continue
            clocks = held[1] if held is not None else {}
            observed: dict[str, IdleClock] = {}
            for gpu in node.snapshot.gpus:
                key = gpu.uuid or str(gpu.index)
                clock = clocks.get(key) or IdleClock()
                clock.observe(now, gpu.utilization_pct)
                observed[key] = clock
            seen[node.label] = (node, observed)
        self._nodes = seen
        self._now = now

    def idle_for(self, node: str, gpu: GpuSample) -> float | None:
        """Seconds `gpu` of `node` has been idle, or `None` while it is busy or unseen."""
        held = self._nodes.get(node)
        clock = held[1].get(gpu.uuid or str(gpu.index)) if held is not None else None
        idle = clock.idle_for(self._now) if clock is not None else None
        return None if idle is None else idle.seconds
