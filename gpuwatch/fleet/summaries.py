"""A fleet's nodes from per-node figures, for the fleet table: bytes per node, not per GPU.

Each gpuwatch daemon exports its node's figures (`gpuwatch_node_*`, computed by the
screen's own code, and `gpuwatch_gpus_available`, by pick's): a refresh reads them, plain
selectors of one series per node, narrowed to the targets scraped since. What needs
Prometheus (idle holders over 10 minutes, each user's memory and GPUs, the GPU models)
comes from the recording rules of `examples/gpuwatch-fleet-rules.yml` where the server
records them, else from their expressions evaluated on the spot, in parts, each every
`SLOW_EVERY` reads. A node's age and staleness come from its own series
(`gpuwatch_sample_timestamp_seconds`, `gpuwatch_sampling_up`) and `up`, as when its GPUs
are read.

What Prometheus computes is unknown (`None`), never a wrong figure, while it cannot be
known yet: a node's users until they are evaluated over a scrape of it (each users query
answers -1 for a node it has no user of, so that a node it does not answer at all is one
the rules have not evaluated since it was first scraped), and its idle holders until
Prometheus holds the window's worth of its data (a GPU seen idle for a minute is not
idle for ten). The screen says that a node is warming up.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gpuwatch import node_figures as f
from gpuwatch.fleet import mapped as m
from gpuwatch.fleet import node_work, series_gpuwatch
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.promql import FamilyQuery, NodeFamilies, Query
from gpuwatch.fleet.series import NO_GPU, aged, stale
from gpuwatch.fleet.source import IDLE_AFTER_S
from gpuwatch.fleet_model import Exporter, NodeState, NodeSummary

_MODELS = "gpuwatch:node_gpu_models:count"
PROBE = f"count({_MODELS})"
"""Answers a number where the rules are recorded, nothing where they are not."""
_IDLE_HELD = "gpuwatch:node_gpus_idle_held:count"
_COUNTS = {f.GPUS: "gpus", "gpuwatch_gpus_available": "gpus_free", f.LEASES: "leases"}
_BYTES = {f.MEMORY_FREE_MAX: "most_free_bytes", f.MEMORY_FREE: "memory_free_bytes"}
_USER_MEMORY = "gpuwatch:node_user_memory_bytes:sum"
_USER_GPUS = "gpuwatch:node_user_gpus:count"
_NONE_ON_EACH_NODE = "or on (job, instance) (count by (job, instance) (gpuwatch_gpu_info$m) * 0)"
_WINDOW_HELD = "and on (job, instance) (count by (job, instance) (gpuwatch_gpu_info$m offset $w))"
"""Only nodes whose data goes back the window: a node scraped for a minute is not known to
have been idle for ten."""
RULES = {
    _IDLE_HELD: (
        "( count by (job, instance) ( "
        "max_over_time(gpuwatch_utilization_ratio$m[$w]) <= 0.014 "
        "and on (job, instance, gpu) "
        "(gpuwatch_leases$m > 0 or gpuwatch_process_memory_bytes$m > 0) ) "
        + _NONE_ON_EACH_NODE
        + " ) "
        + _WINDOW_HELD
    ),
    _USER_MEMORY: "sum by (job, instance, user) (gpuwatch_process_memory_bytes$m)",
    _USER_GPUS: (
        "count by (job, instance, user) "
        "(count by (job, instance, user, gpu) (gpuwatch_process_memory_bytes$m))"
    ),
    _MODELS: "count by (job, instance, model_name) (gpuwatch_gpu_info$m)",
}
"""Each recorded series and the expression the example rules record it by (a test holds
the two to each other, `$m` read as nothing and `$w` as 10m); a source evaluates the
expression where the server records none (or, for idle holders, where it asks another
window `$w`), `$m` the selector's matcher (`promql.FamilyQuery`)."""
NO_USER = -1.0
"""The value of a users query's series for a node with no user: where the rules are
recorded, for a node they were evaluated over, where not, for every node scraped."""
_USERS = (_USER_GPUS, _USER_MEMORY)
STAMP = "gpuwatch_sample_timestamp_seconds"
SAMPLING_UP = "gpuwatch_sampling_up"
_FAST = (
    f.GPUS,
    "gpuwatch_gpus_available",
    *_BYTES,
    f.UTILIZATION,
    f.TEMPERATURE_MAX,
    f.POWER,
    STAMP,
)
"""The daemon's per-node series every refresh reads."""
_ZERO_UNSENT = (f.LEASES, node_work.WAITERS, node_work.LONGEST_WAIT)
"""Per-node series every refresh reads only where they are not 0: a daemon that exports
its node's figures exports these beside them, so one not sent is 0."""
_MOSTLY_ZERO = (*_ZERO_UNSENT, node_work.JOBS_KNOWN, series_gpuwatch.SIMULATED)
MIN_IDLE_WINDOW_S = 60
"""Prometheus's past of a GPU's utilization is read over at least this window."""
SLOW = (_USER_MEMORY, _USER_GPUS, _MODELS, _IDLE_HELD)
"""Per-node families that change slowly, or over minutes (idle holders: idle for 10),
which a source reads less often."""


def plan(idle_after_s: float = IDLE_AFTER_S) -> list[Query]:
    """The queries of every refresh, beside `up` and its time: the daemon's per-node
    series and snapshot time in one query, those mostly 0 (leases, the line of waiting
    jobs) in another, where not 0, and failed sampling; where the daemon reads a
    scheduler, its jobs (one series each) and the GPUs they left idle for `idle_after_s`
    (nothing at all from a node without one)."""
    idle = f">= {float(idle_after_s)!r}"
    return [
        NodeFamilies(_FAST),
        NodeFamilies(_MOSTLY_ZERO, compare="> 0"),
        FamilyQuery(SAMPLING_UP, compare="== 0"),
        FamilyQuery(node_work.JOB_INFO, ("job_id",)),
        FamilyQuery(node_work.ALLOCATED_IDLE, ("gpu",), compare=idle),
    ]


USER_GROUPS = tuple(range(len(_USERS)))
"""The parts of what changes slowly that tell each user's GPUs and memory."""
SLOW_GROUPS = 3
"""What changes slowly is read in this many parts, at different reads: each user's GPUs,
each user's memory (one series per user and node each: the largest answers a refresh
gets), and the GPU models with the idle holders."""


def slow_plan(
    *, recorded: bool, group: int | None = None, idle_after_s: float = IDLE_AFTER_S
) -> list[FamilyQuery]:
    """The queries of what changes slowly (`recorded`: by the rules' names, else their
    expressions): group 0, each user's GPUs on each node; group 1, their memory; group
    2, the GPU models and idle holders (idle for `idle_after_s`, at least
    `MIN_IDLE_WINDOW_S`: from the rules only at theirs); `None`, all."""
    queries = []
    for number, name in enumerate(_USERS):
        if group in (None, number):
            queries.append(_figure(name, ("user",), recorded))
    if group in (None, 2):
        queries.append(_figure(_MODELS, ("model_name",), recorded))
        window_s = max(MIN_IDLE_WINDOW_S, round(idle_after_s))
        at_rules = window_s == IDLE_AFTER_S
        queries.append(_figure(_IDLE_HELD, (), recorded and at_rules, window=f"{window_s}s"))
    return queries


def told(samples: Sequence[Sample], marker: str = f.GPUS) -> bool:
    """Whether a target's series of a read of `plan()` are those of a daemon that exports
    its node's figures (`marker`: one of them): one of an older version does not (nor one
    whose sampling fails, which exports no figure: it is read as down either way)."""
    return any(s.name in (marker, SAMPLING_UP) for s in samples) or not any(
        s.name == STAMP for s in samples
    )


def users_told(samples: Sequence[Sample]) -> bool:
    """Whether a node's series of what changes slowly tell its users: both users queries
    answered for it (its users, or `NO_USER`)."""
    names = {sample.name for sample in samples}
    return all(name in names for name in _USERS)


def _figure(
    name: str, keep: tuple[str, ...], recorded: bool, *, window: str = "10m"
) -> FamilyQuery:
    expression = name + "$m" if recorded else RULES[name].replace("$w", window)
    if name in _USERS:
        evaluated = f"{_MODELS}$m" if recorded else "gpuwatch_gpu_info$m"
        each = f"count by (job, instance) ({evaluated}) * 0 - 1"
        return FamilyQuery(name, keep, expression=f"{expression} or on (job, instance) ({each})")
    return FamilyQuery(name, keep, expression="" if recorded else expression)


class Figures(msgspec.Struct, frozen=True, gc=False):
    """What a node's per-node series say, whenever it is judged. Not tracked by the
    garbage collector (it holds texts, numbers and a `NodeSummary`): a table of 10,000
    nodes keeps one a node, and each tracked object kept makes every full pass of the
    collector longer."""

    error: str | None
    """Why it is not up whatever its age (its daemon has no snapshot, its sampling is
    not current, it has no GPU), or `None`."""
    stamp: float | None
    """Its daemon's newest snapshot time."""
    lease_waiters: int | None
    longest_wait_s: float | None
    summary: NodeSummary


class SlowFigures(msgspec.Struct, frozen=True, gc=False):
    """What a node's series of what changes slowly say (`slow_plan`)."""

    users: tuple[tuple[str, int, int], ...] | None
    """`None`: not known yet."""
    models: tuple[str, ...]
    idle_held: int | None


def slow_figures(samples: Sequence[Sample]) -> SlowFigures:
    """A node's series of what changes slowly, read: a source keeps these while they are
    the same, though its other figures move."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    idle = by_name.get(_IDLE_HELD)
    return SlowFigures(
        users=_users(by_name),
        models=_models(by_name.get(_MODELS, ())),
        idle_held=_count(idle[0].value) if idle else None,
    )


def figures(samples: Sequence[Sample], slow: SlowFigures) -> Figures:
    """A node's series of each refresh, read, with what changes slowly: a source keeps
    these while the series are the same."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    if f.GPUS in by_name:
        for name in _ZERO_UNSENT:
            by_name.setdefault(name, [Sample(name, {}, 0.0)])
    stamps = [s.value for s in by_name.get(STAMP, ())]
    waiters, longest_wait_s = node_work.waiting_line(by_name)
    stamp = max(stamps) if stamps else None
    error = _error(by_name, stamp)
    return Figures(error, stamp, waiters, longest_wait_s, _summary(by_name, slow))


def node_state(
    found: Figures,
    name: str,
    *,
    seen_at: float,
    now: float,
    stale_after_s: float,
    target: str = "",
    job: str | None = None,
) -> NodeState:
    """One gpuwatch node from its per-node figures, up only when its daemon's snapshot is
    current (judged as for a node read GPU by GPU), scraped at `target` (and `job`)."""
    data_at, age_s = aged(seen_at, found.stamp, now)
    error = found.error or stale(age_s, stale_after_s)
    return NodeState(
        name,
        up=error is None,
        snapshot=None,
        data_at=data_at,
        error=error,
        exporter=Exporter.GPUWATCH,
        lease_waiters=found.lease_waiters,
        longest_wait_s=found.longest_wait_s,
        summary=found.summary,
        target=target,
        job=job,
    )


def _error(by_name: dict[str, list[Sample]], stamp: float | None) -> str | None:
    error = series_gpuwatch.daemon_error(by_name, [] if stamp is None else [stamp])
    if error is None and not any(s.value > 0 for s in by_name.get(f.GPUS, ())):
        return NO_GPU
    return error


def _summary(by_name: dict[str, list[Sample]], slow: SlowFigures) -> NodeSummary:
    def one(name: str) -> float | None:
        found = by_name.get(name)
        return found[0].value if found else None

    counts = {field: _count(one(name)) for name, field in _COUNTS.items()}
    if (counts["gpus_free"] or 0) > (counts["gpus"] or 0):
        counts["gpus_free"] = None  # more free GPUs than it has: not a count to show
    sizes = {field: _bytes(one(name)) for name, field in _BYTES.items()}
    ratio, hottest, power = one(f.UTILIZATION), one(f.TEMPERATURE_MAX), one(f.POWER)
    return NodeSummary(
        **counts,
        **sizes,
        utilization_pct=None if ratio is None else _percent(ratio),
        hottest_c=None if hottest is None else m.celsius(hottest),
        power_w=None if power is None else _watts(power),
        idle_held=slow.idle_held,
        users=slow.users,
        models=slow.models,
        **_jobs(by_name),
        simulated=any(s.value == 1 for s in by_name.get(series_gpuwatch.SIMULATED, ())),
    )


def _jobs(by_name: dict[str, list[Sample]]) -> dict[str, int | None]:
    known = by_name.get(node_work.JOBS_KNOWN)
    if not known or known[0].value != 1:
        return {"jobs": None, "idle_allocated": None}
    jobs = {s.labels.get("job_id") for s in by_name.get(node_work.JOB_INFO, ())}
    return {"jobs": len(jobs), "idle_allocated": len(by_name.get(node_work.ALLOCATED_IDLE, ()))}


def _users(by_name: dict[str, list[Sample]]) -> tuple[tuple[str, int, int], ...] | None:
    """Each user's GPUs and memory; `None` until both queries answered for the node (its
    users, or `NO_USER`)."""
    if not all(name in by_name for name in _USERS):  # as users_told, from the names filed
        return None
    gpus = {
        s.labels.get("user"): _count(s.value) or 0
        for s in by_name[_USER_GPUS]
        if s.value != NO_USER
    }
    # A user's GPUs and memory are read at different reads: one with memory there holds a
    # GPU at least, until its GPUs are read.
    return tuple(
        sorted(
            (m.label(s.labels.get("user"), 64) or "", gpus.get(s.labels.get("user"), 1), size)
            for s in by_name[_USER_MEMORY]
            if s.value != NO_USER and (size := _bytes(s.value)) is not None
        )
    )


def _models(samples: Sequence[Sample]) -> tuple[str, ...]:
    return tuple(sorted({label for s in samples if (label := m.label(s.labels.get("model_name")))}))


def _count(value: float | None) -> int | None:
    return None if value is None else m.small_whole(value, 1 << 20)


def _bytes(value: float | None) -> int | None:
    return None if value is None else m.whole_bytes(value)


def _percent(ratio: float) -> float | None:
    return ratio * 100 if 0 <= ratio <= 1 else None


def _watts(value: float) -> float | None:
    return value if 0 <= value <= 100_000_000 else None
