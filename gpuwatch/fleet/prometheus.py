"""A fleet read from a Prometheus server: one round of instant queries sent at once,
whatever the number of nodes (`gpuwatch.fleet.promql` says which and why), narrowed to
what the reader needs (`Needs`), the same for every exporter.

A node is a scrape target (`job`, `instance`): every target of a job whose targets send
GPU series (in the last hour) is a node, up or not, never read or read an hour ago; so
is a target at a GPU exporter's own port (19400, 9400, 9835) in a job never up at all.
`timestamp(up)` says whether and when each was last scraped, and carries the labels
Prometheus gives it (on Kubernetes, the exporter pod's own `pod`: no workload's); the
names query names a node that went down. Prometheus answers an instant query with its
evaluation time, not each sample's own time, so the age of a node's data is its
`timestamp(up)` (and, for a gpuwatch daemon, the snapshot time it exports). A target
whose scrape fails has `up == 0` and its series vanish: it is down, with Prometheus's
reason (`lastError` of `/api/v1/targets`, one more request only where a node is down).

Only a gpuwatch daemon too old to export what the round asks of it (its node's figures,
its verdict on each GPU) costs one more round, narrowed to it. State kept between reads,
each where a benchmark shows it pays (`bench/fleet_cost.py`, docs/development/
benchmarks.md): whether the server records the fleet rules (probed every
`PROBE_EVERY` reads: the rules spare Prometheus their expressions), and the table's slow
figures (users, GPU models, idle holders: the largest answers, read in parts every
`SLOW_EVERY` reads); and which target each node's label stands for, for `history` and
`focus`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace

from gpuwatch.fleet import node_history, promql, series_gpuwatch, summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.fetch import Budget, HttpOptions
from gpuwatch.fleet.mapped import MAX_GPU_INDEX, small_whole
from gpuwatch.fleet.names import host_of, node_text, safe_name
from gpuwatch.fleet.promapi import DEFAULT_MAX_BYTES, PromClient
from gpuwatch.fleet.promql import Query
from gpuwatch.fleet.series import (
    aged,
    claimed,
    host_named,
    judged,
    stale,
    target_mapping,
    target_state,
)
from gpuwatch.fleet.source import Needs
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Exporter, FleetState, NodeState, NodeSummary, Snapshot
from gpuwatch.request import IDLE_MAX_UTIL_PCT

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_STALE_AFTER_S = 120.0
"""Two scrapes at Prometheus's default interval (1m), so that a node is stale only when
a scrape was missed, whatever interval the server uses up to that."""
PROBE_EVERY = 30
"""Reads between two probes of the recording rules (a minute at the screen's 2 s)."""
SLOW_EVERY = 15
"""Reads between two readings of each part of what changes slowly (`summaries.slow_plan`:
30 s at the screen's 2 s refresh)."""
Target = tuple[str, str]
"""(job, instance): one scraped endpoint."""
_UP, _NAMES, _PROBE = "up", "names", "probe"
_MAIN, _DETAIL, _SLOW = "main", "detail", "slow"


@dataclass(frozen=True, slots=True)
class _Asked:
    """One query of a round: what it asks, whose answer it is, and the matcher that
    narrows it to some targets ("" for all)."""

    query: Query | str
    role: str = _MAIN
    matcher: str = ""

    @property
    def family(self) -> str:
        return "" if isinstance(self.query, str) else self.query.family

    def promql(self) -> str:
        if self.query == _UP:
            return promql.UP_SEEN
        if self.query == _NAMES:
            return promql.names()
        if self.query == _PROBE:
            return summaries.PROBE
        assert not isinstance(self.query, str)
        return self.query.promql(self.matcher)


@dataclass
class _Found:
    """What a read's answers say, by target."""

    evaluated: float = 0.0
    seen: dict[Target, float] = field(default_factory=dict)
    """Each target's last scrape time, negative where it failed."""
    scraped_as: dict[Target, dict[str, str]] = field(default_factory=dict)
    names: dict[Target, str] = field(default_factory=dict)
    exporters: dict[Target, str] = field(default_factory=dict)
    last: dict[Target, float] = field(default_factory=dict)
    """A gpuwatch daemon's last snapshot time, within the names query's hour."""
    samples: dict[Target, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    details: dict[Target, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    slow: dict[Target, list[Sample]] = field(default_factory=lambda: defaultdict(list))
    rules: bool | None = None


class PrometheusSource:
    """A fleet as a Prometheus server (or Thanos, VictoriaMetrics, Mimir) sees it.

    >>> PrometheusSource("http://prometheus:9090").description
    'prometheus http://prometheus:9090'
    """

    def __init__(
        self,
        url: str,
        *,
        options: HttpOptions | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
        needs: Needs | None = None,
        budget: Budget | None = None,
    ) -> None:
        """`needs`: what the reader needs (`Needs()`: everything of every GPU); `budget`:
        what all reads together may spend (a command's), else each read may spend
        `timeout_s` and `max_bytes`."""
        self.client = PromClient(
            url, options=options or HttpOptions(), timeout_s=timeout_s, max_bytes=max_bytes
        )
        self.stale_after_s = stale_after_s
        self.needs = needs or Needs()
        self._clock = clock
        self._budget = budget
        self._reads = 0
        self._rules = False
        self._slow: dict[int, dict[Target, list[Sample]]] = {}
        self._due: tuple[int, ...] = ()
        self._targets: dict[str, Target] = {}
        self._uuids: dict[str, dict[str, int]] = {}
        self._focus: frozenset[str] = frozenset()
        self.queries_sent = 0
        """Instant queries sent so far, for the benches."""

    @property
    def description(self) -> str:
        return f"prometheus {self.client.url}"

    def read(self) -> FleetState:
        """The fleet now; raises `SourceError` when the server cannot be read."""
        self._reads += 1
        budget = self._budget or self.client.budget()
        found = _Found()
        self._ask(self._round(), budget, found)
        if later := self._older_daemons(found):
            self._ask(later, budget, found)
        self._keep_slow(found)
        nodes = self._nodes(found)
        down = sorted({job for (job, _), node in nodes.items() if node.error and not node.up})
        if down and self.needs.errors:
            errors = self.client.scrape_errors(down, budget=budget)
            nodes = {t: _with_error(node, errors.get(t)) for t, node in nodes.items()}
        fleet = claimed(nodes.values())
        self._remember(fleet, nodes)
        return FleetState(
            taken_at=found.evaluated or self._clock(), source=self.description, nodes=fleet
        )

    def focus(self, nodes: Collection[str]) -> None:
        """Reads `nodes` (by `NodeState.key`) GPU by GPU too, from the next read on, where
        the fleet is read as per-node figures (a node's detail screen shows its GPUs);
        `()` ends it. Safe to call from another thread than the reader's."""
        self._focus = frozenset(nodes)

    def history(
        self, node: str, *, duration_s: float = 600.0, points: int = 240
    ) -> tuple[GpuSeries, ...]:
        """The node's (by `NodeState.key`) GPUs over the last `duration_s`: memory used,
        utilization, temperature and power, `points` samples each (one `query_range`);
        empty for a node the last `read()` did not see."""
        if (target := self._targets.get(node)) is None:
            return ()
        end = self._clock()
        step_s = max(1.0, duration_s / points)
        query = node_history.query(*target)
        matrix = self.client.query_range(query, end - duration_s, end, step_s)
        return node_history.series(matrix, self._uuids.get(node, {}))

    def close(self) -> None:
        """Nothing stays open between reads."""

    def _round(self) -> list[_Asked]:
        """The queries of one read: targets and names, the gpuwatch daemons' as the
        reader needs them, dcgm-exporter's and nvidia_gpu_exporter's, and for the table
        what changes slowly where it is due, and the nodes in focus GPU by GPU."""
        needs = self.needs
        asked = [_Asked(_UP), _Asked(_NAMES)]
        asked += [_Asked(query) for query in self._gpuwatch_plan()]
        asked += [_Asked(query) for query in promql.dcgm_values(placement=needs.placement)]
        asked += [_Asked(query) for query in promql.smi_values(placement=needs.placement)]
        if not needs.per_node or needs.placement:
            return asked
        if self._reads % PROBE_EVERY == 1:
            asked.append(_Asked(_PROBE))
        self._due = self._slow_due()
        asked += [
            _Asked(query, _SLOW)
            for group in self._due
            for query in summaries.slow_plan(
                recorded=self._rules, group=group, idle_after_s=needs.idle_after_s
            )
        ]
        focused = {self._targets[key][1] for key in self._focus if key in self._targets}
        if focused:
            matcher = promql.instances(focused)
            detail = promql.gpuwatch_values(placement=False)
            asked += [_Asked(query, _DETAIL, matcher) for query in detail]
        return asked

    def _gpuwatch_plan(self) -> Sequence[Query]:
        needs = self.needs
        if needs.placement and needs.verdicts:
            return promql.verdicts(needs.free_bytes, IDLE_MAX_UTIL_PCT / 100)
        if needs.placement or not needs.per_node:
            return promql.gpuwatch_values(placement=needs.placement, mig=needs.mig)
        return summaries.plan(needs.idle_after_s)

    def _older_daemons(self, found: _Found) -> list[_Asked]:
        """The GPU-by-GPU queries of the daemons that answered the round with neither
        their node's figures nor their verdicts (a version before them), narrowed to
        them: nothing where there are none."""
        needs = self.needs
        if needs.placement and needs.verdicts:
            marker = promql.AVAILABLE_GPUS
        elif needs.per_node and not needs.placement:
            marker = promql.NODE_GPUS
        else:
            return []
        older = [
            instance
            for (job, instance), exporter in found.exporters.items()
            if exporter == Exporter.GPUWATCH
            and found.seen.get((job, instance), -1.0) > 0
            and not summaries.told(found.samples.get((job, instance), []), marker)
        ]
        if not older:
            return []
        queries = promql.gpuwatch_values(placement=needs.placement, mig=needs.mig)
        matcher = promql.instances(older)
        return [_Asked(query, _DETAIL, matcher) for query in queries]

    def _slow_due(self) -> tuple[int, ...]:
        """The parts of what changes slowly that this read reads: all until every part
        is held, then each part every `SLOW_EVERY` reads, at different reads."""
        if len(self._slow) < summaries.SLOW_GROUPS:
            return tuple(range(summaries.SLOW_GROUPS))
        step = SLOW_EVERY // summaries.SLOW_GROUPS
        turn = self._reads % SLOW_EVERY
        due = turn // step
        return (due,) if turn % step == 0 and due < summaries.SLOW_GROUPS else ()

    def _ask(self, asked: Sequence[_Asked], budget: Budget, found: _Found) -> None:
        """Sends `asked` at once, within what is left of `budget`, and files the answers
        into `found`."""
        texts = [item.promql() for item in asked]
        self.queries_sent += len(texts)
        answers = self.client.samples(texts, [item.family for item in asked], budget=budget)
        for item, (evaluated, vector) in zip(asked, answers, strict=True):
            found.evaluated = max(found.evaluated, evaluated)
            if item.query == _UP:
                for sample in vector:
                    target = _target(sample.labels)
                    found.seen[target] = sample.value
                    found.scraped_as[target] = sample.labels
            elif item.query == _NAMES:
                _file_names(vector, found)
            elif item.query == _PROBE:
                found.rules = bool(vector)
            else:
                into = {_MAIN: found.samples, _DETAIL: found.details, _SLOW: found.slow}
                filed = into[item.role]
                for sample in vector:
                    filed[_target(sample.labels)].append(sample)

    def _keep_slow(self, found: _Found) -> None:
        """Files what changes slowly into the parts held, and notes whether the rules
        are recorded."""
        if found.rules is not None:
            self._rules = found.rules
        for group in self._due:
            families = {q.family for q in summaries.slow_plan(recorded=True, group=group)}
            self._slow[group] = {
                target: [s for s in samples if s.name in families]
                for target, samples in found.slow.items()
            }
        self._due = ()

    def _nodes(self, found: _Found) -> dict[Target, NodeState]:
        """Every target of a job with GPU series, and every target at a GPU exporter's
        own port (a job none of whose targets was ever up): a node each."""
        jobs = {job for job, _ in found.exporters} | {job for job, _ in found.samples}
        targets = {t for t in found.seen if t[0] in jobs or _exporter_port(t[1])}
        targets |= set(found.samples)
        several = _instances_in_several_jobs(targets)
        now = found.evaluated or self._clock()
        return {t: self._node(t, found, now, several) for t in sorted(targets)}

    def _node(
        self, target: Target, found: _Found, now: float, several: frozenset[str]
    ) -> NodeState:
        job, instance = target
        shown = f"{job}/{instance}" if instance in several else instance
        seen = found.seen.get(target, 0.0)
        samples = found.samples.get(target, []) + found.details.get(target, [])
        labels = found.scraped_as.get(target, {})
        name = self._name(target, found, labels)
        if seen <= 0 or not samples:
            return replace(self._down(target, found, now, seen), target=shown, job=job)
        if self.needs.per_node and not self.needs.placement and _figures_of(samples):
            state = self._summarized(target, found, now, seen, name)
        elif self.needs.verdicts and self.needs.placement and _verdicts_of(samples):
            state = self._given(samples, now, seen, name)
        else:
            state = target_state(
                samples,
                fallback_name=name,
                seen_at=seen,
                now=now,
                stale_after_s=self.stale_after_s,
                scraped_as=labels,
            )
        return replace(state, target=shown, job=job)

    def _down(self, target: Target, found: _Found, now: float, seen: float) -> NodeState:
        """A target Prometheus cannot scrape, or that sends no GPU series now: under its
        last name, with the age of its daemon's last snapshot where that is known."""
        job, instance = target
        labels = found.scraped_as.get(target, {})
        name = found.names.get(target)
        name = name if name and host_named(name, labels) else instance
        last = found.last.get(target, 0.0)
        age_s = max(0.0, now - last) if last > 0 else None
        where = f"{safe_name(instance)} (job {safe_name(job)})"
        if seen > 0:
            why = f"{where} sends Prometheus no GPU series now"
        else:
            why = f"Prometheus cannot scrape {where}"
        return NodeState(node_text(name), up=False, snapshot=None, age_s=age_s, error=why)

    def _summarized(
        self,
        target: Target,
        found: _Found,
        now: float,
        seen: float,
        name: str,
    ) -> NodeState:
        """A gpuwatch daemon read as its node's figures (and, in focus, GPU by GPU)."""
        slow = [s for part in self._slow.values() for s in part.get(target, ())]
        figures = summaries.figures(found.samples[target], summaries.slow_figures(slow))
        name = node_text(name)
        stale_after_s = self.stale_after_s
        state = summaries.node_state(
            figures, name, seen_at=seen, now=now, stale_after_s=stale_after_s
        )
        detail = found.details.get(target)
        if not detail:
            return state
        labels = found.scraped_as.get(target, {})
        mapping = target_mapping(detail, fallback_name=name, scraped_as=labels)
        gpus = judged(mapping, seen_at=seen, now=now, stale_after_s=stale_after_s)
        return replace(gpus, name=state.name, summary=state.summary)

    def _given(self, samples: list[Sample], now: float, seen: float, name: str) -> NodeState:
        """A gpuwatch daemon read as its verdict on each GPU: the GPUs it would give out,
        and how many GPUs it has (`NodeState.given_only`)."""
        mapped = series_gpuwatch.available_mapped(samples)
        shown = node_text(name)
        taken_at, age_s = aged(seen, mapped.data_at, now)
        error = mapped.error or stale(age_s, self.stale_after_s)
        snapshot = Snapshot(taken_at, shown, None, None, mapped.gpus, ())
        by_name = {s.name: s.value for s in samples}
        gpus, given = by_name.get(promql.NODE_GPUS), by_name.get(promql.AVAILABLE_GPUS)
        return NodeState(
            shown,
            up=error is None,
            snapshot=snapshot,
            age_s=age_s,
            error=error,
            exporter=Exporter.GPUWATCH,
            leases=(),
            given_only=True,
            summary=_counts(gpus, given),
        )

    def _name(self, target: Target, found: _Found, labels: dict[str, str]) -> str:
        """A target's name: its host label (from its series, else the names query's),
        where that names a node, else its instance's host."""
        for sample in found.samples.get(target, ()):
            for key in ("hostname", "Hostname"):
                if (value := sample.labels.get(key)) and host_named(value, labels):
                    return value
        name = found.names.get(target)
        return name if name and host_named(name, labels) else host_of(target[1])

    def _remember(self, fleet: tuple[NodeState, ...], nodes: dict[Target, NodeState]) -> None:
        """Which target each node's key stands for, and its GPUs' indices, for `history`
        and `focus`."""
        by_place = {(node.job, node.target): target for target, node in nodes.items()}
        self._targets = {node.key: by_place[(node.job, node.target)] for node in fleet}
        self._uuids = {
            node.key: {gpu.uuid: gpu.index for gpu in node.snapshot.gpus if gpu.uuid}
            for node in fleet
            if node.snapshot is not None
        }


def _target(labels: dict[str, str]) -> Target:
    return (labels.get("job", ""), labels.get("instance", ""))


EXPORTER_PORTS = frozenset({"19400", "9400", "9835"})
"""gpuwatch's daemon (in the docs), dcgm-exporter's and nvidia_gpu_exporter's ports."""


def _exporter_port(instance: str) -> bool:
    return instance.rpartition(":")[2] in EXPORTER_PORTS


def _with_error(node: NodeState, error: str | None) -> NodeState:
    return node if error is None or node.up else replace(node, error=f"{node.error}: {error}")


def _counts(gpus: float | None, given: float | None) -> NodeSummary:
    """A daemon's count of its GPUs and of those it would give out, checked."""
    total = None if gpus is None else small_whole(gpus, MAX_GPU_INDEX + 1)
    free = None if given is None else small_whole(given, MAX_GPU_INDEX + 1)
    if total is not None and free is not None and free > total:
        total = free = None  # no node gives out more GPUs than it has
    return NodeSummary(total, free, None, None, None, None, None, None, None)


def _instances_in_several_jobs(targets: Collection[Target]) -> frozenset[str]:
    jobs: dict[str, set[str]] = defaultdict(set)
    for job, instance in targets:
        jobs[instance].add(job)
    return frozenset(instance for instance, found in jobs.items() if len(found) > 1)


def _file_names(vector: list[Sample], found: _Found) -> None:
    for sample in vector:
        target = _target(sample.labels)
        found.exporters.setdefault(target, sample.labels.get("exporter", ""))
        if sample.value > 0:
            found.last[target] = max(found.last.get(target, 0.0), sample.value)
        name = sample.labels.get("hostname") or sample.labels.get("Hostname")
        if name and target not in found.names:
            found.names[target] = name


def _figures_of(samples: list[Sample]) -> bool:
    """Whether a daemon answered with its node's figures (or sampling that fails)."""
    return any(s.name in (promql.NODE_GPUS, summaries.SAMPLING_UP) for s in samples)


def _verdicts_of(samples: list[Sample]) -> bool:
    return any(s.name in (promql.AVAILABLE_GPUS, summaries.SAMPLING_UP) for s in samples)
