"""A fleet read from a Prometheus server: a fixed set of instant queries a refresh,
whatever the number of nodes, sent at once (`gpuwatch.fleet.promql` says which and why).

The first read asks which exporters the fleet runs (the names query) and reads only
their families; later reads send everything in one round. The identity of gpuwatch
nodes' GPUs (`gpuwatch_gpu_info`, total memory) is read on the first read, every
`IDENTITY_EVERY` reads, and whenever a node shows GPUs the held identity lacks.

Prometheus answers an instant query with its evaluation time, not each sample's own
time, so the age of a node's data is `timestamp(up)` (and, for a gpuwatch daemon, the
snapshot time it exports). A target whose scrape fails has `up == 0` and its series
vanish (Prometheus marks them stale), so it shows as down under its last name, with
the age of its last snapshot. Bytes grow with nodes and GPUs, never with history.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from gpuwatch.fleet import node_history, promql, series_gpuwatch, summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.fetch import Budget, HttpOptions
from gpuwatch.fleet.promapi import DEFAULT_MAX_BYTES, PromClient
from gpuwatch.fleet.promql import Query
from gpuwatch.fleet.series import (
    TargetMapping,
    host_of,
    judged,
    merged,
    node_name,
    safe_name,
    target_mapping,
)
from gpuwatch.fleet_model import Exporter, FleetState, NodeState
from gpuwatch.gpu_history import GpuSeries

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_STALE_AFTER_S = 120.0
"""Two scrapes at Prometheus's default interval (1m), so that a node is stale only when
a scrape was missed, whatever interval the server uses up to that."""
NARROW_SHARE = 0.6
"""A refresh re-reads only the targets scraped since the last one, named in each
selector (which Prometheus looks up in its index: it reads only their series), while
they are at most this share of all; past it, reading all costs no more."""
IDENTITY_EVERY = 30
"""Reads between two readings of GPU identity (a minute at the screen's 2 s refresh)."""
SLOW_EVERY = 15
"""Reads between two readings of each part of what changes slowly: node names, GPU
models, who runs where, idle holders (30 s at the screen's 2 s refresh; each user's memory
and GPUs are the largest answer a refresh gets). A node new to the fleet has its name read
at the next read."""
Target = tuple[str, str]
"""(job, instance): one scraped endpoint."""
Found = tuple[dict[Target, list[Sample]], dict[Target, float], dict[Target, float]]
"""A round's samples by target, each target's `up`, and when each was last scraped."""
_FREE = "gpuwatch_memory_free_bytes"
_NAMES, _UP_SEEN, _PROBE = "names", "up", "probe"
_NO_SAMPLES: list[Sample] = []
"""The identity of a target that has none: one list, so that its mapping is kept."""
_NAMES_NOW = "names now"
_AVAILABLE, _AVAILABLE_GPUS = promql.AVAILABLE_BYTES, promql.AVAILABLE_GPUS


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
        placement: bool = False,
        per_node: bool = False,
        idle_after_s: float = summaries.IDLE_AFTER_S,
    ) -> None:
        """`placement=True` reads only what placement's rules use (for `gpuwatch where`):
        no temperatures, power, model names or process names. `per_node=True` (the fleet
        table) reads a fleet of gpuwatch daemons as per-node figures (`summaries`): from
        the recording rules of `examples/gpuwatch-fleet-rules.yml` where the server
        records them, else their expressions; its nodes have a `summary` and no GPUs,
        but those `focus` names (never for placement, which needs every GPU). A held GPU
        counts among a node's idle holders once idle for `idle_after_s`."""
        self.client = PromClient(
            url, options=options or HttpOptions(), timeout_s=timeout_s, max_bytes=max_bytes
        )
        self.stale_after_s = stale_after_s
        self.placement = placement
        self.per_node = per_node and not placement
        self.idle_after_s = idle_after_s
        self._rules = False
        self._focus: frozenset[str] = frozenset()
        self._clock = clock
        self._targets: dict[str, Target] = {}
        self._uuids: dict[str, dict[str, int]] = {}
        self._last: dict[Target, float] = {}
        self._names: dict[Target, str] = {}
        self._exporters: frozenset[Exporter] | None = None
        self._identity: dict[Target, list[Sample]] = {}
        self._slow: dict[Target, list[Sample]] = {}
        self._slow_parts: dict[int, dict[Target, list[Sample]]] = {}
        self._new_targets = False
        """Whether the last read saw a target new to it, whose name the next one reads."""
        """Each part of what changes slowly (`summaries.SLOW_GROUPS`), as last read."""
        self._summary: dict[Target, list[Sample]] = {}
        self._held: dict[Target, list[Sample]] = {}
        """Each target's series as last read: a round reads only targets scraped since."""
        self._scraped: dict[Target, float] = {}
        """When each target was scraped, as of the last round."""
        self._told = True
        """Whether every gpuwatch daemon exports its node's figures (an older one does
        not: then the fleet is read GPU by GPU)."""
        self._mappings: dict[Target, tuple[str, list[Sample], list[Sample], TargetMapping]] = {}
        """Each target's mapped series, and the lists they were mapped from."""
        self._read: dict[
            Target,
            tuple[list[Sample], list[Sample], summaries.Figures, summaries.SlowFigures],
        ] = {}
        """Each target's per-node figures, the lists (fast, slow) they were read from, and
        what the slow list says."""
        self._reads = 0
        self.queries_sent = 0
        """Instant queries sent so far, for the benches."""

    @property
    def description(self) -> str:
        return f"prometheus {self.client.url}"

    def read(self) -> FleetState:
        """The fleet now; raises `SourceError` when the server cannot be read."""
        self._reads += 1
        budget = self.client.budget()
        first = self._exporters is None
        if first:  # which exporters: their families only, from now on
            self._ask([_NAMES, _PROBE] if self.per_node else [_NAMES], budget)
        if self.summarized:
            fleet = self._read_summarized(budget)
            if self.summarized:
                return fleet
            # A daemon exports no figures of its node: GPU by GPU from now on.
        fresh = first or not self._identity or self._reads % IDENTITY_EVERY == 0
        evaluated, (_, up, seen) = self._ask([_NAMES, _UP_SEEN], budget)
        moved = [target for target, at in seen.items() if self._scraped.get(target) != at]
        samples: dict[Target, list[Sample]] = {}
        if moved or fresh:
            narrowed = bool(self._held) and 0 < len(moved) <= NARROW_SHARE * len(seen)
            families = [q for q in self._plan(fresh) if not isinstance(q, str)]
            narrow_to = moved if narrowed else None
            found_at, (samples, _, _) = self._ask(families, budget, narrow_to)
            evaluated = max(evaluated, found_at)
            self._hold(samples, moved if narrowed else None)
        self._scraped = seen
        self._held = {target: held for target, held in self._held.items() if target in up}
        if self._lacks_identity(samples):  # only a target scraped since can show new GPUs
            self._ask(promql.identity(self.placement), budget)
        return self._fleet(self._held, up, seen, evaluated or self._clock())

    def _hold(self, samples: dict[Target, list[Sample]], moved: list[Target] | None) -> None:
        """Keeps what a round read: every target's series, or (`moved`) those of the
        targets scraped since the last round, each replaced whole (a series gone with
        the scrape, a process that ended, goes with it)."""
        if moved is None:
            self._held = dict(samples)
            return
        for target in moved:
            if found := samples.get(target):
                self._held[target] = found
            else:  # down, or no GPU exporter (node_exporter): as if never read
                self._held.pop(target, None)

    def _read_summarized(self, budget: Budget) -> FleetState:
        """A refresh from per-node figures (`summaries`): those of the targets scraped
        since the last read, named in each selector, as a refresh GPU by GPU names them;
        what changes slowly (names, GPU models, who runs where, idle holders) in parts,
        each every `SLOW_EVERY` reads, held between. `up` and scrape times, which give
        each node's state and age, at every read; the nodes in focus GPU by GPU."""
        slow_group = self._slow_due()
        plan: list[Query | str] = [_UP_SEEN]
        if slow_group in (None, 0) or self._new_targets:
            plan.append(_NAMES)
        if self._reads % IDENTITY_EVERY == 0:
            plan.append(_PROBE)
        evaluated, (_, up, seen) = self._ask(plan, budget)
        moved = [target for target, at in seen.items() if self._scraped.get(target) != at]
        self._new_targets = not set(seen).issubset(self._scraped)
        narrowed = bool(self._summary) and len(moved) <= NARROW_SHARE * len(seen)
        if moved or not self._summary:
            self._read_figures(budget, moved if narrowed else None)
        if slow_group != -1:
            self._read_slow(budget, slow_group)
        self._scraped = seen
        details = self._read_details(budget) if self._told else {}
        return self._fleet(self._summary, up, seen, evaluated or self._clock(), details)

    def _slow_due(self) -> int | None:
        """Which part of what changes slowly this read reads: `None` all (none is held
        yet), -1 none."""
        if len(self._slow_parts) < summaries.SLOW_GROUPS:
            return None
        step = SLOW_EVERY // summaries.SLOW_GROUPS
        turn = self._reads % SLOW_EVERY
        return turn // step if turn % step == 0 and turn // step < summaries.SLOW_GROUPS else -1

    def _read_figures(self, budget: Budget, moved: list[Target] | None) -> None:
        """Reads the per-node figures into the held ones: every target's, or (`moved`)
        those of the targets scraped since, each replaced whole."""
        _, (samples, _, _) = self._ask(summaries.plan(self.idle_after_s), budget, moved)
        self._told = all(summaries.told(found) for found in samples.values())
        if moved is None:
            self._summary = dict(samples)
        else:
            for target in moved:
                if found := samples.get(target):
                    self._summary[target] = found
                else:
                    self._summary.pop(target, None)
        for target in moved if moved is not None else samples:
            stamps = [s.value for s in samples.get(target, ()) if s.name == summaries.STAMP]
            if stamps:  # a node that goes down keeps its data's age
                self._last[target] = max(stamps)

    def _read_slow(self, budget: Budget, group: int | None) -> None:
        """Reads a part (`None`: all) of what changes slowly, from the rules where they
        are recorded, and joins the parts held into each target's slow series."""
        groups = range(summaries.SLOW_GROUPS) if group is None else (group,)
        idle_after_s = self.idle_after_s
        plan = [
            query
            for number in groups
            for query in summaries.slow_plan(
                recorded=self._rules, group=number, idle_after_s=idle_after_s
            )
        ]
        _, (samples, _, _) = self._ask(plan, budget)
        names = {n: {q.family for q in summaries.slow_plan(recorded=True, group=n)} for n in groups}
        for number in groups:
            before, self._slow_parts[number] = self._slow_parts.get(number, {}), {}
            for target, found in samples.items():
                part = [s for s in found if s.name in names[number]]
                # Mostly unchanged: the list held stays, and so do the figures read from it.
                held = before.get(target)
                self._slow_parts[number][target] = held if held == part else part
        slow: dict[Target, list[Sample]] = defaultdict(list)
        for held_part in self._slow_parts.values():
            for target, found in held_part.items():
                slow[target] += found
        previous, self._slow = self._slow, {}
        for target, found in slow.items():
            held = previous.get(target)
            self._slow[target] = held if held == found else found

    def _figures(self, target: Target, fast: list[Sample]) -> summaries.Figures:
        """The target's figures, read from its held series: kept while those are the
        very lists read last time (a target not scraped since costs no reading)."""
        slow = self._slow.get(target, _NO_SAMPLES)
        held = self._read.get(target)
        if held is not None and held[0] is fast and held[1] is slow:
            return held[2]
        same_slow = held is not None and held[1] is slow
        slow_read = held[3] if held is not None and same_slow else summaries.slow_figures(slow)
        found = summaries.figures(fast, slow_read)
        self._read[target] = (fast, slow, found, slow_read)
        return found

    def focus(self, nodes: Collection[str]) -> None:
        """Reads `nodes` GPU by GPU too, from the next read on, where the fleet is read as
        per-node figures (a node's detail screen shows its GPUs); `()` ends it. Safe to
        call from another thread than the reader's."""
        self._focus = frozenset(nodes)

    def _read_details(self, budget: Budget) -> dict[Target, list[Sample]]:
        """The series of the targets of the nodes in focus, every family of the fleet's
        exporters, identity included: one more round of queries, narrowed to them."""
        targets = {self._targets[name] for name in self._focus if name in self._targets}
        if not targets:
            return {}
        matcher = promql.instances(instance for _, instance in targets)
        plan = [q for q in self._plan(identity=True) if not isinstance(q, str)]
        self.queries_sent += len(plan)
        texts = [q.promql(matcher) for q in plan]
        answers = self.client.samples(texts, [q.family for q in plan], budget=budget)
        found: dict[Target, list[Sample]] = defaultdict(list)
        for _, vector in answers:
            for sample in vector:
                if (target := _target(sample.labels)) in targets:
                    found[target].append(sample)
        return found

    @property
    def summarized(self) -> bool:
        """Whether reads come as per-node figures: asked for, and the fleet runs gpuwatch
        daemons only (the figures know no other exporter)."""
        only_gpuwatch = self._exporters == frozenset({Exporter.GPUWATCH})
        return self.per_node and only_gpuwatch and self._told

    def read_placed(self, min_free_bytes: int | None) -> FleetState | None:
        """The fleet as placement sees it, in one round of queries whatever the number of
        nodes (no discovery of exporters first): the names of the nodes with GPU series
        now (a node that is down never fits), and gpuwatch's families as
        `promql.placed` asks them: for whole GPUs (`min_free_bytes` not `None`), free
        memory only where it reaches `min_free_bytes` (where a GPU has less, its free
        memory is unknown: placement takes it no more than before) and no MIG devices.
        `None` where the names show other exporters: read the fleet whole."""
        self._reads += 1
        plan: list[Query | str] = [_NAMES_NOW, _UP_SEEN, *promql.placed(min_free_bytes)]
        evaluated, (samples, up, seen) = self._ask(plan, self.client.budget())
        if self._exporters != frozenset({Exporter.GPUWATCH}):
            return None
        return self._fleet(samples, up, seen, evaluated or self._clock())

    def read_available(
        self, min_free_bytes: int, count: int = 1, *, idle_util_pct: float = 5.0
    ) -> FleetState | None:
        """The nodes that could give `count` GPUs with `min_free_bytes` free to a request
        judged as the default one (`Request.judged_as_default`), read in one round of a
        few queries whatever the number of nodes: each node's own verdict on its GPUs
        (`gpuwatch_memory_available_bytes`: pick's rules, run by its daemon) in place of
        their processes, leases and limits. Each GPU it gives out comes with its free
        memory, `uuid` and utilization; no other GPU, and no node that cannot fit (this
        is no whole fleet: where explains no misses from it). `None` where the fleet runs
        other exporters, or a daemon that tells no verdict: read it as `read_placed` does.
        `idle_util_pct`: the default limit of utilization, which no GPU given out passes."""
        self._reads += 1
        plan: list[Query | str] = [
            _NAMES_NOW,
            _UP_SEEN,
            *promql.available(min_free_bytes, idle_util_pct / 100),
        ]
        evaluated, (samples, up, seen) = self._ask(plan, self.client.budget())
        told = {t for t, found in samples.items() if any(s.name == _AVAILABLE_GPUS for s in found)}
        if self._exporters != frozenset({Exporter.GPUWATCH}) or not told.issuperset(self._last):
            return None
        now = evaluated or self._clock()
        nodes = []
        for target, found in samples.items():
            given = [Sample(_FREE, s.labels, s.value) for s in found if s.name == _AVAILABLE]
            if len(given) < count or up.get(target) != 1:
                continue  # it cannot fit: the answer leaves it out (where has no misses)
            # What a GPU it gives out has available is its free memory.
            mapped = series_gpuwatch.available_mapped([*given, *found])
            name = safe_name(node_name(found) or host_of(target[1]))
            node = (name, Exporter.GPUWATCH, mapped)
            seen_at = seen.get(target, now)
            nodes.append(judged(node, seen_at=seen_at, now=now, stale_after_s=self.stale_after_s))
        return FleetState(taken_at=now, source=self.description, nodes=merged(nodes))

    def _plan(self, identity: bool) -> list[Query | str]:
        exporters = self._exporters or frozenset()
        plan: list[Query | str] = [_NAMES, _UP_SEEN]
        plan += promql.values(exporters, placement=self.placement)
        if identity and Exporter.GPUWATCH in exporters:
            plan += promql.identity(self.placement)
        return plan

    def _ask(
        self,
        plan: Sequence[Query | str],
        budget: Budget,
        narrow_to: Sequence[Target] | None = None,
    ) -> tuple[float, Found]:
        """Sends `plan` at once, within what is left of the read's `budget` (each family
        but identity's narrowed to the targets `narrow_to`, where given), and files its
        answers: the names query sets the exporters and the names; identity families
        replace the held identity."""
        matcher = promql.instances(t[1] for t in narrow_to) if narrow_to is not None else ""
        texts = [
            _text(q)
            if isinstance(q, str)
            else q.promql("" if q.family in promql.IDENTITY else matcher)
            for q in plan
        ]
        families = ["" if isinstance(q, str) else q.family for q in plan]
        self.queries_sent += len(texts)
        answers = self.client.samples(texts, families, budget=budget)
        samples: dict[Target, list[Sample]] = defaultdict(list)
        identity: dict[Target, list[Sample]] = defaultdict(list)
        up: dict[Target, float] = {}
        seen: dict[Target, float] = {}
        for query, family, (_, vector) in zip(plan, families, answers, strict=True):
            if query in (_NAMES, _NAMES_NOW):
                self._file_names(vector)
            elif query == _PROBE:
                self._rules = bool(vector)
            elif query == _UP_SEEN:
                for sample in vector:
                    target = _target(sample.labels)
                    up[target] = 1.0 if sample.value > 0 else 0.0
                    seen[target] = abs(sample.value)
            else:
                by_target = identity if family in promql.IDENTITY else samples
                for sample in vector:
                    by_target[_target(sample.labels)].append(sample)
        if any(family in promql.IDENTITY for family in families):
            self._identity = dict(identity)
        evaluated = max((at for at, _ in answers), default=0.0)
        return evaluated, (samples, up, seen)

    def _file_names(self, vector: list[Sample]) -> None:
        self._names = _names(vector)
        self._last = {_target(s.labels): s.value for s in vector}
        exporters = {s.labels.get("exporter") for s in vector}
        self._exporters = frozenset(e for e in Exporter if e.value in exporters)

    def _lacks_identity(self, samples: dict[Target, list[Sample]]) -> bool:
        """Whether a gpuwatch node shows a GPU whose identity is not held: a node new to
        the fleet, or one whose GPUs changed."""
        if Exporter.GPUWATCH not in (self._exporters or frozenset()):
            return False
        for target, found in samples.items():
            held = {s.labels.get("gpu") for s in self._identity.get(target, ())}
            if any(s.name == _FREE and s.labels.get("gpu") not in held for s in found):
                return True
        return False

    def _fleet(
        self,
        samples: dict[Target, list[Sample]],
        up: dict[Target, float],
        seen: dict[Target, float],
        now: float,
        details: dict[Target, list[Sample]] | None = None,
    ) -> FleetState:
        """`details`: the series of targets read GPU by GPU beside their figures."""
        known = set(self._last) | set(samples)
        up = {target: value for target, value in up.items() if target in known}
        states = {
            target: self._state(
                target,
                self._names.get(target) or host_of(target[1]),
                (self._identity.get(target, _NO_SAMPLES), samples[target])
                if target in samples
                else None,
                up,
                seen,
                now,
                (details or {}).get(target),
            )
            for target in sorted(set(samples) | set(up))
        }
        self._mappings = {t: held for t, held in self._mappings.items() if t in states}
        self._read = {t: held for t, held in self._read.items() if t in states}
        nodes = merged(states.values())
        self._remember(states, nodes)
        return FleetState(taken_at=now, source=self.description, nodes=nodes)

    def _state(
        self,
        target: Target,
        name: str | None,
        parts: tuple[list[Sample], list[Sample]] | None,
        up: dict[Target, float],
        seen: dict[Target, float],
        now: float,
        detail: list[Sample] | None = None,
    ) -> NodeState:
        """`parts`: the target's identity and its other series, or its per-node figures;
        `detail`: beside those, its every series (its GPUs, for a detail screen)."""
        seen_at = seen.get(target, now)
        if up.get(target, 1) != 1 or parts is None or not (parts[0] or parts[1]):
            # Its series are gone with the failed scrape: only a daemon's last snapshot
            # time (kept by the names query) says how old its data is.
            last = self._last.get(target, 0.0)
            age_s = max(0.0, now - last) if last > 0 else None
            where = f"{safe_name(target[1])} (job {safe_name(target[0])})"
            why = (
                f"Prometheus cannot scrape {where}"
                if up.get(target, 1) != 1
                else f"{where} sends Prometheus no GPU series now"
            )
            shown = safe_name(name or target[1])
            return NodeState(shown, up=False, snapshot=None, age_s=age_s, error=why)
        if self.summarized:
            shown = safe_name(name or host_of(target[1]))
            figures = self._figures(target, parts[1])
            state = summaries.node_state(
                figures, shown, seen_at=seen_at, now=now, stale_after_s=self.stale_after_s
            )
            if not detail:
                return state
            mapping = target_mapping(detail, fallback_name=shown)
            gpus = judged(mapping, seen_at=seen_at, now=now, stale_after_s=self.stale_after_s)
            return replace(gpus, name=state.name, summary=state.summary)
        found = self._mapping(target, name or host_of(target[1]), parts)
        return judged(found, seen_at=seen_at, now=now, stale_after_s=self.stale_after_s)

    def _mapping(
        self,
        target: Target,
        name: str,
        parts: tuple[list[Sample], list[Sample]],
    ) -> TargetMapping:
        """The target's mapped series: kept while its identity and series are the very
        lists mapped last time (a target not scraped since costs no mapping)."""
        held = self._mappings.get(target)
        if held is not None and held[0] == name and held[1] is parts[0] and held[2] is parts[1]:
            return held[3]
        found = target_mapping([*parts[0], *parts[1]], fallback_name=name)
        self._mappings[target] = (name, parts[0], parts[1], found)
        return found

    def _remember(self, states: dict[Target, NodeState], nodes: tuple[NodeState, ...]) -> None:
        """Which target a node name stands for, and its GPUs' indices, for `history`."""
        winners = {node.name: node for node in nodes}
        self._targets = {}
        for target, state in states.items():
            if winners.get(state.name) is state:
                self._targets[state.name] = target
        self._uuids = {
            node.name: {gpu.uuid: gpu.index for gpu in node.snapshot.gpus if gpu.uuid}
            for node in nodes
            if node.snapshot is not None
        }

    def history(
        self, node: str, *, duration_s: float = 600.0, points: int = 240
    ) -> tuple[GpuSeries, ...]:
        """The node's GPUs over the last `duration_s`: memory used, utilization,
        temperature and power, `points` samples each (one `query_range`); empty for a
        node the last `read()` did not see."""
        if (target := self._targets.get(node)) is None:
            return ()
        end = self._clock()
        step_s = max(1.0, duration_s / points)
        query = node_history.query(*target)
        matrix = self.client.query_range(query, end - duration_s, end, step_s)
        return node_history.series(matrix, self._uuids.get(node, {}))

    def close(self) -> None:
        """Nothing stays open between reads."""


def _target(labels: dict[str, str]) -> Target:
    return (labels.get("job", ""), labels.get("instance", ""))


def _text(query: str) -> str:
    if query in (_NAMES, _NAMES_NOW):
        return promql.names(now=query == _NAMES_NOW)
    if query == _PROBE:
        return summaries.PROBE
    return promql.UP_SEEN


def _names(vector: list[Sample]) -> dict[Target, str]:
    names: dict[Target, str] = {}
    for sample in vector:
        found = node_name([sample])
        if found:
            names.setdefault(_target(sample.labels), found)
    return names
