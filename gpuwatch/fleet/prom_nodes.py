"""From a round's answers (`gpuwatch.fleet.rounds.Found`) to one `NodeState` per target:
every target of a job with GPU series (in the last hour), and every target at a GPU
exporter's own port, is a node, up or not; each named by its host label where that names
a node, else by its target; a gpuwatch daemon read as its figures (the table), as its
verdict on each GPU (`where` at pick's default limits), or GPU by GPU, as the read asked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from functools import partial
from operator import itemgetter

import msgspec
from msgspec.structs import replace

from gpuwatch.fleet import promql, series_gpuwatch, summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import MAX_GPU_INDEX, small_whole
from gpuwatch.fleet.names import host_of, node_text, safe_name
from gpuwatch.fleet.rounds import Found, Target
from gpuwatch.fleet.series import (
    aged,
    host_named,
    judged,
    judged_again,
    stale,
    target_mapping,
    target_state,
)
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import Exporter, NodeState, NodeSummary
from gpuwatch.models import Snapshot

_NONE: list[Sample] = []
"""The slow series of a node with none: one list, so that its figures are kept."""
EXPORTER_PORTS = frozenset({"19400", "9400", "9835"})
"""gpuwatch's daemon (in the docs), dcgm-exporter's and nvidia_gpu_exporter's ports."""


def read_figures(target: Target, fast: list[Sample], slow: list[Sample]) -> summaries.Figures:
    """What a node's figures say, read from its series (`fast`) and what changes slowly."""
    return summaries.figures(fast, summaries.slow_figures(slow))


class Place(msgspec.Struct, frozen=True):
    """Where a node is scraped: its target as shown (`job/instance` where the instance is
    in several jobs), and its job."""

    target: str
    job: str


class KeptNodes:
    """Each target's node as last built, with what it was built from: a node whose series
    are the very ones held then (not scraped since) is not built again, and is the very
    same node until its data grows too old (`series.judged_again`). The fleet table's
    source keeps them."""

    def __init__(self) -> None:
        self._held: dict[Target, tuple[Inputs, NodeState]] = {}
        self._several: frozenset[str] = frozenset()
        self._detailed: set[Target] = set()
        self.built = 0
        """Nodes built (not kept) so far, for the benches and tests."""

    def node(
        self,
        target: Target,
        inputs: Inputs,
        now: float,
        stale_after_s: float,
        build: Callable[[], NodeState],
    ) -> NodeState:
        """The node `build` makes of `inputs`; as kept, judged again at `now`, while they
        are those it was built from."""
        held = self._held.get(target)
        if held is not None and held[0].same(inputs):
            return self._judged_again(target, held, now, stale_after_s)
        node = build()
        self.built += 1
        self._held[target] = (inputs, node)
        return node

    def again(self, target: Target, now: float, stale_after_s: float) -> NodeState | None:
        """The node as kept, judged again at `now`, for a target nothing new was read of
        (`Found.fresh`); `None` where none is kept."""
        held = self._held.get(target)
        return None if held is None else self._judged_again(target, held, now, stale_after_s)

    def _judged_again(
        self, target: Target, held: tuple[Inputs, NodeState], now: float, stale_after_s: float
    ) -> NodeState:
        """The node kept, judged again at `now`; kept as judged where that made it stale."""
        node = judged_again(held[1], now, stale_after_s)
        if node is not held[1]:
            self._held[target] = (held[0], node)
        return node

    def fresh(
        self, found: Found, targets: set[Target], several: frozenset[str]
    ) -> set[Target] | None:
        """Forgets the nodes of targets no longer in the fleet; the targets whose nodes
        must be looked at again (`None`: all): those that may have changed
        (`Found.fresh`), and those read GPU by GPU now or the read before (their series
        of that are not held). All where an instance is in more or fewer jobs than
        before (its node's target is shown `job/instance` then)."""
        if len(self._held) > len(targets) or not self._held.keys() <= targets:
            self._held = {t: held for t, held in self._held.items() if t in targets}
        detailed, self._detailed = self._detailed, found.details.keys() & targets
        same, self._several = several == self._several, several
        if found.fresh is None or not same:
            return None
        return found.fresh | detailed | self._detailed


class Inputs(msgspec.Struct, frozen=True, gc=False):
    """What a target's node is built from: its series (lists and labels, held by the
    table's source while not scraped since, so compared by identity) and the rest. Not
    tracked by the garbage collector, as `NodeState` is not."""

    series: tuple[object, ...]
    values: tuple[object, ...]

    def same(self, other: Inputs) -> bool:
        return self.values == other.values and all(
            mine is theirs or (not mine and not theirs)
            for mine, theirs in zip(self.series, other.series, strict=True)
        )


class Judge(msgspec.Struct, frozen=True):
    """How a read's nodes are made: what it needed, the staleness limit, how a node's
    figures are read (the table's memory keeps them while their series are the same),
    and where nodes are kept between reads (the table's: `KeptNodes`)."""

    needs: Needs
    stale_after_s: float
    figures: Callable[[Target, list[Sample], list[Sample]], summaries.Figures] = read_figures
    kept: KeptNodes | None = None


def nodes_of(judge: Judge, found: Found, now: float) -> dict[Target, NodeState]:
    """Every target of a job with GPU series, and every target at a GPU exporter's
    own port (a job none of whose targets was ever up): a node each."""
    jobs = set(map(itemgetter(0), found.exporters)) | set(map(itemgetter(0), found.samples))
    targets = {t for t in found.seen if t[0] in jobs or _exporter_port(t[1])}
    targets |= set(found.samples)
    several = _instances_in_several_jobs(targets)
    kept = judge.kept
    if kept is None:
        return {t: _node(judge, t, found, now, several) for t in sorted(targets)}
    # Where the round read only the targets scraped since, the others' nodes are kept
    # without a look at their inputs (the very ones held): at 10,000 nodes, an eighth of
    # them scraped between two refreshes, looking at all cost as much as building that
    # eighth (bench/fleet_read_parts.py).
    fresh = kept.fresh(found, targets, several)
    stale_after_s = judge.stale_after_s
    nodes = {}
    for target in sorted(targets):
        if (
            fresh is None
            or target in fresh
            or (node := kept.again(target, now, stale_after_s)) is None
        ):
            inputs = _inputs(target, found, several)
            build = partial(_node, judge, target, found, now, several)
            node = kept.node(target, inputs, now, stale_after_s, build)
        nodes[target] = node
    return nodes


def _inputs(target: Target, found: Found, several: frozenset[str]) -> Inputs:
    """What `_node` reads of `target`. The labels Prometheus gives it are compared by
    value (`up` read whole, with the names, brings new ones of the same), and a daemon's
    last snapshot time of the names query only where the node is down (only there is it
    read): a reading of the names builds no node again."""
    samples = found.samples.get(target)
    series = (samples, found.details.get(target), found.slow.get(target))
    names = found.names or {}
    seen = found.seen.get(target)
    down = seen is None or seen <= 0 or not samples
    values = (
        seen,
        names.get(target),
        found.last.get(target) if down else None,
        target[1] in several,
        found.scraped_as.get(target),
    )
    return Inputs(series, values)


def _node(
    judge: Judge, target: Target, found: Found, now: float, several: frozenset[str]
) -> NodeState:
    job, instance = target
    place = Place(f"{job}/{instance}" if instance in several else instance, job)
    seen = found.seen.get(target, 0.0)
    samples = found.samples.get(target, [])
    details = found.details.get(target)
    labels = found.scraped_as.get(target, {})
    name = _name(target, found, labels)
    if seen <= 0 or not (samples or details):
        return _down(target, found, now, seen, place)
    if judge.needs.per_node and not judge.needs.placement and _figures_of(samples):
        return _summarized(judge, target, found, now, seen, name, place)
    if judge.needs.verdicts and judge.needs.placement and _verdicts_of(samples):
        return _given(judge, samples, now, seen, name, place)
    return target_state(
        [*samples, *details] if details else samples,
        fallback_name=name,
        seen_at=seen,
        now=now,
        stale_after_s=judge.stale_after_s,
        scraped_as=labels,
        target=place.target,
        job=place.job,
    )


def _down(target: Target, found: Found, now: float, seen: float, place: Place) -> NodeState:
    """A target Prometheus cannot scrape, or that sends no GPU series now: under its
    last name, with the age of its daemon's last snapshot where that is known."""
    job, instance = target
    labels = found.scraped_as.get(target, {})
    name = (found.names or {}).get(target)
    name = name if name and host_named(name, labels) else instance
    last = found.last.get(target, 0.0)
    data_at = last if last > 0 else None
    where = f"{safe_name(instance)} (job {safe_name(job)})"
    if seen > 0:
        why = f"{where} sends Prometheus no GPU series now"
    else:
        why = f"Prometheus cannot scrape {where}"
    return NodeState(
        node_text(name),
        up=False,
        snapshot=None,
        data_at=data_at,
        error=why,
        target=place.target,
        job=place.job,
    )


def _summarized(
    judge: Judge,
    target: Target,
    found: Found,
    now: float,
    seen: float,
    name: str,
    place: Place,
) -> NodeState:
    """A gpuwatch daemon read as its node's figures (and, in focus, GPU by GPU)."""
    figures = judge.figures(target, found.samples[target], found.slow.get(target, _NONE))
    shown = node_text(name)
    stale_after_s = judge.stale_after_s
    state = summaries.node_state(
        figures,
        shown,
        seen_at=seen,
        now=now,
        stale_after_s=stale_after_s,
        target=place.target,
        job=place.job,
    )
    detail = found.details.get(target)
    if not detail:
        return state
    labels = found.scraped_as.get(target, {})
    mapping = target_mapping(detail, fallback_name=shown, scraped_as=labels)
    gpus = judged(mapping, seen_at=seen, now=now, stale_after_s=stale_after_s)
    return replace(gpus, name=shown, summary=state.summary, target=place.target, job=place.job)


def _given(
    judge: Judge, samples: list[Sample], now: float, seen: float, name: str, place: Place
) -> NodeState:
    """A gpuwatch daemon read as its verdict on each GPU: the GPUs it would give out,
    and how many GPUs it has (`NodeState.offered`)."""
    mapped = series_gpuwatch.available_mapped(samples)
    shown = node_text(name)
    taken_at, age_s = aged(seen, mapped.data_at, now)
    error = mapped.error or stale(age_s, judge.stale_after_s)
    offered = Snapshot(taken_at, shown, None, None, mapped.gpus, ())
    by_name = {s.name: s.value for s in samples}
    gpus, given = by_name.get(promql.NODE_GPUS), by_name.get(promql.AVAILABLE_GPUS)
    return NodeState(
        shown,
        up=error is None,
        snapshot=None,
        data_at=taken_at,
        error=error,
        exporter=Exporter.GPUWATCH,
        leases=(),
        offered=offered,
        summary=_counts(gpus, given),
        target=place.target,
        job=place.job,
    )


def _name(target: Target, found: Found, labels: dict[str, str]) -> str:
    """A target's name where its series carry no host label (read as its figures or its
    verdicts; read GPU by GPU, its series' own label wins): the host label the names
    query found, where that names a node, else its instance's host."""
    name = (found.names or {}).get(target)
    return name if name and host_named(name, labels) else host_of(target[1])


def _exporter_port(instance: str) -> bool:
    return instance.rpartition(":")[2] in EXPORTER_PORTS


def _counts(gpus: float | None, given: float | None) -> NodeSummary:
    """A daemon's count of its GPUs and of those it would give out, checked."""
    total = None if gpus is None else small_whole(gpus, MAX_GPU_INDEX + 1)
    free = None if given is None else small_whole(given, MAX_GPU_INDEX + 1)
    if total is not None and free is not None and free > total:
        total = free = None  # no node gives out more GPUs than it has
    return NodeSummary(total, free, None, None, None, None, None, None, None)


def _instances_in_several_jobs(targets: Collection[Target]) -> frozenset[str]:
    """The instances of more than one target (each target is one job's instance)."""
    counts = Counter(map(itemgetter(1), targets))
    return frozenset(instance for instance, count in counts.items() if count > 1)


def _figures_of(samples: list[Sample]) -> bool:
    """Whether a daemon answered with its node's figures (or sampling that fails)."""
    return any(s.name in (promql.NODE_GPUS, summaries.SAMPLING_UP) for s in samples)


def _verdicts_of(samples: list[Sample]) -> bool:
    return any(s.name in (promql.AVAILABLE_GPUS, summaries.SAMPLING_UP) for s in samples)
