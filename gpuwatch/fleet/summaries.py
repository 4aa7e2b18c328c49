"""A fleet's nodes from per-node figures: the recording rules of
`examples/gpuwatch-fleet-rules.yml`, or, where the server records none, their
expressions evaluated on the spot.

The fleet table shows nodes, not GPUs, so a refresh of it reads per-node series: bytes
per node, not per GPU. Recorded, they cost the server once per evaluation and a fleet of
10,000 nodes refreshes as cheaply as one of 1,000 read GPU by GPU; evaluated at each
refresh, they cost it the aggregation each time (a few milliseconds at 500 nodes of
8 GPUs) and the client as little. A node's age and staleness still come from its own
series (`gpuwatch_sample_timestamp_seconds`, `gpuwatch_sampling_up`) and `up`, as when
its GPUs are read.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet import node_work
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.nodes import Exporter, NodeState, NodeSummary
from gpuwatch.fleet.promql import FamilyQuery

PROBE = "count(gpuwatch:node_gpus:count)"
"""Answers a number where the rules are recorded, nothing where they are not."""
_COUNTS = {
    "gpuwatch:node_gpus:count": "gpus",
    "gpuwatch:node_gpus_free:count": "gpus_free",
    "gpuwatch:node_leases:sum": "leases",
    "gpuwatch:node_gpus_idle_held:count": "idle_held",
}
_BYTES = {
    "gpuwatch:node_memory_free_bytes:max": "most_free_bytes",
    "gpuwatch:node_memory_free_bytes:sum": "memory_free_bytes",
}
_UTILIZATION = "gpuwatch:node_utilization_ratio:avg"
_HOTTEST = "gpuwatch:node_temperature_celsius:max"
_POWER = "gpuwatch:node_power_watts:sum"
_USER_MEMORY = "gpuwatch:node_user_memory_bytes:sum"
_USER_GPUS = "gpuwatch:node_user_gpus:count"
_MODELS = "gpuwatch:node_gpu_models:count"
_IDLE_HELD = "gpuwatch:node_gpus_idle_held:count"
_READABLE = "unless on (job, instance, gpu) gpuwatch_gpu_up == 0"
_NONE_ON_EACH_NODE = "or on (job, instance) (count by (job, instance) (gpuwatch_gpu_info) * 0)"
RULES = {
    "gpuwatch:node_gpus:count": "count by (job, instance) (gpuwatch_gpu_info)",
    "gpuwatch:node_gpus_free:count": "max by (job, instance) (gpuwatch_gpus_available)",
    "gpuwatch:node_memory_free_bytes:max": (
        f"max by (job, instance) (gpuwatch_memory_free_bytes {_READABLE})"
    ),
    "gpuwatch:node_memory_free_bytes:sum": (
        f"sum by (job, instance) (gpuwatch_memory_free_bytes {_READABLE})"
    ),
    "gpuwatch:node_utilization_ratio:avg": (
        f"avg by (job, instance) (gpuwatch_utilization_ratio {_READABLE})"
    ),
    "gpuwatch:node_temperature_celsius:max": (
        f"max by (job, instance) (gpuwatch_temperature_celsius {_READABLE})"
    ),
    "gpuwatch:node_power_watts:sum": f"sum by (job, instance) (gpuwatch_power_watts {_READABLE})",
    "gpuwatch:node_leases:sum": (
        'sum by (job, instance) ({__name__=~"gpuwatch_leases|gpuwatch_mig_leases"}) '
        + _NONE_ON_EACH_NODE
    ),
    _IDLE_HELD: (
        "count by (job, instance) ( "
        "max_over_time(gpuwatch_utilization_ratio[10m]) <= 0.014 "
        "and on (job, instance, gpu) "
        "(gpuwatch_leases > 0 or gpuwatch_process_memory_bytes > 0) ) " + _NONE_ON_EACH_NODE
    ),
    "gpuwatch:node_user_memory_bytes:sum": (
        "sum by (job, instance, user) (gpuwatch_process_memory_bytes)"
    ),
    "gpuwatch:node_user_gpus:count": (
        "count by (job, instance, user) "
        "(count by (job, instance, user, gpu) (gpuwatch_process_memory_bytes))"
    ),
    _MODELS: "count by (job, instance, model_name) (gpuwatch_gpu_info)",
}
"""Each per-node series and the expression the example rules record it by (a test holds
the two to each other); a source evaluates the expression where the server records none."""
EVALUATED = "max(timestamp(gpuwatch:node_gpus:count))"
"""When the recording rules were last evaluated: their figures move only then."""
STAMP = "gpuwatch_sample_timestamp_seconds"
_FAST = (*(c for c in _COUNTS if c != _IDLE_HELD), *_BYTES, _UTILIZATION, _HOTTEST, _POWER)
"""The per-node figures every refresh reads."""
_LINE = (node_work.WAITERS, node_work.LONGEST_WAIT)
"""The daemon's own series of its line of waiting jobs: one per node already, so read as
they are, not recorded."""
SLOW = (_USER_MEMORY, _USER_GPUS, _MODELS, _IDLE_HELD)
"""Per-node families that change slowly, or over minutes (idle holders: idle for 10),
which a source may read less often."""


def plan(*, recorded: bool) -> list[FamilyQuery]:
    """The queries of every refresh from per-node figures, beside `up` and
    `timestamp(up)`: the figures (`recorded`: by their names, else their expressions),
    and the daemon's snapshot time and failed sampling, one per node."""
    queries = [_figure(name, (), recorded) for name in _FAST]
    queries += [FamilyQuery(name, ()) for name in (STAMP, *_LINE)]
    queries.append(FamilyQuery("gpuwatch_sampling_up", compare="== 0"))
    return queries


def slow_plan(*, recorded: bool) -> list[FamilyQuery]:
    """The queries of what changes slowly: who runs where, the GPU models, idle holders."""
    queries = [_figure(name, ("user",), recorded) for name in (_USER_MEMORY, _USER_GPUS)]
    queries.append(_figure(_MODELS, ("model_name",), recorded))
    queries.append(_figure(_IDLE_HELD, (), recorded))
    return queries


def _figure(name: str, keep: tuple[str, ...], recorded: bool) -> FamilyQuery:
    return FamilyQuery(name, keep, expression="" if recorded else RULES[name])


def node_state(
    samples: Sequence[Sample], name: str, *, seen_at: float, now: float, stale_after_s: float
) -> NodeState:
    """One gpuwatch node from its recorded figures, up only when its daemon's snapshot is
    current (judged as for a node read GPU by GPU)."""
    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    stamps = [s.value for s in by_name.get("gpuwatch_sample_timestamp_seconds", ())]
    data_at = min(seen_at, max(stamps)) if stamps else seen_at
    age_s = max(0.0, now - data_at)
    error = _error(by_name, stamps, age_s, stale_after_s)
    waiters, longest_wait_s = node_work.waiting_line(by_name)
    return NodeState(
        name,
        up=error is None,
        snapshot=None,
        age_s=age_s,
        error=error,
        exporter=Exporter.GPUWATCH,
        lease_waiters=waiters,
        longest_wait_s=longest_wait_s,
        summary=_summary(by_name),
    )


def _error(
    by_name: dict[str, list[Sample]], stamps: list[float], age_s: float, stale_after_s: float
) -> str | None:
    if not stamps:
        return "its daemon has no snapshot yet"
    if any(s.value == 0 for s in by_name.get("gpuwatch_sampling_up", ())):
        return "its daemon's sampling is not current (see gpuwatch status there)"
    if not by_name.get("gpuwatch:node_gpus:count"):
        return "its exporter answers but reports no GPU"
    if age_s > stale_after_s:
        return f"stale: its newest data is {age_s:.0f}s old (the limit is {stale_after_s:g}s)"
    return None


def _summary(by_name: dict[str, list[Sample]]) -> NodeSummary:
    def one(name: str) -> float | None:
        found = by_name.get(name)
        return found[0].value if found else None

    counts = {field: _count(one(name)) for name, field in _COUNTS.items()}
    sizes = {field: _bytes(one(name)) for name, field in _BYTES.items()}
    ratio, hottest, power = one(_UTILIZATION), one(_HOTTEST), one(_POWER)
    return NodeSummary(
        **counts,
        **sizes,
        utilization_pct=None if ratio is None else _percent(ratio),
        hottest_c=None if hottest is None else m.celsius(hottest),
        power_w=None if power is None else _watts(power),
        users=_users(by_name),
        models=_models(by_name.get(_MODELS, ())),
    )


def _users(by_name: dict[str, list[Sample]]) -> tuple[tuple[str, int, int], ...]:
    gpus = {s.labels.get("user"): _count(s.value) or 0 for s in by_name.get(_USER_GPUS, ())}
    return tuple(
        sorted(
            (m.label(s.labels.get("user"), 64) or "", gpus.get(s.labels.get("user"), 0), size)
            for s in by_name.get(_USER_MEMORY, ())
            if (size := _bytes(s.value)) is not None
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
