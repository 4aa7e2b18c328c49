"""What a Prometheus source keeps between the fleet table's refreshes: only what a benchmark
shows pays. A one-shot read (`where`, `fleet --once`, `fleet --json`) keeps nothing.

Measured by bench/fleet_cost.py (c) and (e) at 500 gpuwatch nodes of 8 GPUs and 5 targets
never up, scraped every 5 s, refreshes 2 s apart, on a 2-core machine shared with other
work (docs/development/benchmarks.md has the runs): reading everything at every refresh
took 0.7 s, 150 ms of CPU and 0.9 to 1.2 MiB of JSON a refresh (the bounds: 0.5 s and
1 MiB). Of that,

- each daemon's node figures were 541 KiB: the targets scraped since the last refresh are
  read again (Prometheus selects them, in the same round: `promql.scraped_since`), the
  others' figures held; so are dcgm-exporter's and nvidia_gpu_exporter's GPUs, and `up`
  (whole with the names), which at 1,000 nodes of a mixed fleet (bench/fleet_refresh_cost.py)
  took a refresh from 581 to 211 KiB;
- each node as built from its series, kept while they are the very series held: a node
  not scraped since is the very same node, only judged stale once its data grows too old
  (`prom_nodes.KeptNodes`), which with the above took that refresh from 29 to 15 ms of
  CPU (and the screen keeps its row);
- which targets the refresh read something of (`Found.fresh`): what is worked out of each
  target anew (its node, its held series, whether its daemon is too old for the round,
  whether its users are known) is worked out for those alone, the others' as it was. At
  10,000 nodes (bench/fleet_read_parts.py) every refresh looked at every target five
  times over, more than it spent building the nodes scraped since;
- why each target that is down is (`/api/v1/targets`) was 242 KiB: asked again only
  where the targets down change, or every `PROBE_EVERY` refreshes;
- the names were 73 KiB: read every `SLOW_EVERY` refreshes, and at the next refresh for
  a target new to the source; with them, which exporters the fleet runs, whose families
  alone are asked (three requests fewer a refresh of a fleet of gpuwatch daemons);
- what changes slowly (each user's memory and GPUs, the GPU models, idle holders; users'
  memory alone 292 KiB) is read in parts, each every `SLOW_EVERY` refreshes; a node up
  whose users are not known yet (new, or not yet evaluated by the rules) has them asked
  again at the next refresh, narrowed to such nodes, until they are;
- whether the server records the fleet rules, probed every `PROBE_EVERY` refreshes: the
  rules spare Prometheus their expressions (0.2 s of its CPU a refresh at 500 nodes);
- what each node's series of what changes slowly say (`summaries.slow_figures`), kept
  while they are the very series held: summaries.figures and slow_figures were two fifths
  of a refresh's CPU in the source. (Its other figures are read again only with its node,
  which is built again only where scraped since: at 10,000 nodes, 16 refreshes read them
  36,183 times and never with the very series of the time before.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuwatch.fleet import promql, summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.prom_nodes import KeptNodes
from gpuwatch.fleet.promql import Query
from gpuwatch.fleet.rounds import HELD, NAMES, PROBE, SLOW, UP, Asked, Found, Target
from gpuwatch.fleet.summaries import Figures, SlowFigures
from gpuwatch.fleet_model import Exporter

PROBE_EVERY = 30
"""Refreshes between two probes of the recording rules, and between two readings of why
targets are down (a minute at the screen's 2 s)."""
SLOW_EVERY = 15
"""Refreshes between two readings of the names, and of each part of what changes slowly
(`summaries.slow_plan`: 30 s at the screen's 2 s refresh)."""


class TableMemory:
    """What the table's source held from its earlier refreshes (see the module's doc)."""

    def __init__(self, idle_after_s: float) -> None:
        self.idle_after_s = idle_after_s
        self.reads = 0
        self.rules = False
        self._since: float | None = None
        self._held: dict[Target, list[Sample]] = {}
        """Each target's series of the families asked of the targets scraped since."""
        self._seen: dict[Target, float] = {}
        self._scraped_as: dict[Target, dict[str, str]] = {}
        self._up_since: float | None = None
        self._planned: frozenset[Exporter] = frozenset()
        self._exporters_asked: frozenset[Exporter] = frozenset()
        """The exporters whose families the last refresh asked (and held)."""
        self._names: Found | None = None
        self._new_targets = False
        self._slow: dict[int, dict[Target, list[Sample]]] = {}
        self._due: tuple[int, ...] = ()
        self._unknown_users: frozenset[Target] = frozenset()
        """Targets up, read as figures, whose users are not known yet."""
        self._narrowed: tuple[int, ...] = ()
        """The parts asked this refresh of `_unknown_users` alone."""
        self._slow_lists: dict[Target, list[Sample]] = {}
        self._down: frozenset[Target] | None = None
        self._errors: dict[Target, str] = {}
        self._slow_read: dict[Target, tuple[list[Sample], SlowFigures]] = {}
        self.nodes = KeptNodes()
        """Each node as last built, while its series are the same."""

    def plan(self, exporters: Mapping[Exporter, Sequence[Query]]) -> list[Asked]:
        """The table's queries of this refresh: `up`, the daemons' figures and the other
        exporters' GPUs (`exporters`: each one's queries, asked where the fleet runs it),
        of the targets scraped since the last refresh once one was read (all of them where
        the names are due, or an exporter was not asked the last time); the names where
        due, the probe of the rules where due, and the parts of what changes slowly that
        are due."""
        self.reads += 1
        names_due = self._names is None or self._new_targets or self.reads % SLOW_EVERY == 0
        self._up_since = None if names_due else self._since
        asked = [Asked(UP, since=self._up_since)]
        runs = self.exporters()
        families = {Exporter.GPUWATCH: summaries.plan(self.idle_after_s), **exporters}
        planned = [
            exporter
            for exporter in families
            if exporter is Exporter.GPUWATCH or runs is None or exporter in runs
        ]
        for exporter in planned:
            since = self._since if exporter in self._exporters_asked else None
            asked += [Asked(query, HELD, since=since) for query in families[exporter]]
        self._planned = frozenset(planned)
        if names_due:
            asked.append(Asked(NAMES))
        if self.reads % PROBE_EVERY == 1:
            asked.append(Asked(PROBE))
        self._due = self._slow_due()
        unknown = {instance for _, instance in self._unknown_users}
        self._narrowed = tuple(g for g in summaries.USER_GROUPS if unknown and g not in self._due)
        return [
            *asked,
            *self._slow_asked(self._due, ""),
            *self._slow_asked(self._narrowed, promql.instances(unknown) if unknown else ""),
        ]

    def _slow_asked(self, groups: tuple[int, ...], matcher: str) -> list[Asked]:
        return [
            Asked(query, SLOW, matcher)
            for group in groups
            for query in summaries.slow_plan(
                recorded=self.rules, group=group, idle_after_s=self.idle_after_s
            )
        ]

    def keep(self, found: Found) -> None:
        """Files this refresh's answers into what is held, and what is held into `found`:
        figures of targets not scraped since, names not asked this time, the parts of what
        changes slowly; and which targets may have changed (`found.fresh`), so that what
        is worked out of each target anew is only theirs."""
        if found.rules is not None:
            self.rules = found.rules
        # `up` narrowed: the targets it answers for are all that may have been scraped
        # since, or appeared (a new target is scraped since); the others are as held.
        answered = set(found.seen) if self._up_since is not None else None
        if answered is not None:
            found.seen = {**self._seen, **found.seen}
            found.scraped_as = {**self._scraped_as, **found.scraped_as}
        self._seen, self._scraped_as = found.seen, found.scraped_as
        self._keep_held(found, answered)
        if found.names is None and self._names is not None:
            found.names = self._names.names
            found.exporters, found.last = self._names.exporters, self._names.last
        else:
            self._names = found
        # New: up now, not when the names were read. Not "unnamed": another job's target
        # (node_exporter, Prometheus) is never named, and would cost every refresh the
        # names and every exporter's families.
        held = self._names.seen if self._names is not None else {}
        self._new_targets = any(
            found.seen[t] > 0 >= held.get(t, 0.0) for t in answered or found.seen
        )
        slow_changed = self._keep_slow(found)
        found.slow = self._slow_lists
        if answered is None:  # `up` read whole: a target may have gone
            self._slow_read = {t: held for t, held in self._slow_read.items() if t in found.seen}
            found.fresh = None
        else:
            found.fresh = answered | found.held.keys() | slow_changed
        self._unknown_users = self._users_unknown(found)

    def _keep_slow(self, found: Found) -> set[Target]:
        """Files the parts of what changes slowly read this refresh; the targets whose
        series of them are not the very lists held before. A part read again is compared
        with that part as held, target by target; a target's lists are joined again only
        where a part of them changed (mostly none). Joining every target's parts and
        comparing the joined lists cost 31 to 133 ms of CPU at each part's read at 10,000
        nodes, a part compared alone 19 to 23 ms (the stand-in of bench/fleet_scale.py)."""
        changed: set[Target] = set()
        for group in (*self._due, *self._narrowed):
            families = {q.family for q in summaries.slow_plan(recorded=True, group=group)}
            read = {
                target: [s for s in samples if s.name in families]
                for target, samples in found.slow.items()
            }
            held = self._slow.get(group, {})
            if group in self._narrowed:  # a few targets' answers, over what is held
                read = {**held, **{t: got for t, got in read.items() if got}}
            for target, got in read.items():
                was = held.get(target)
                if was is not None and (was is got or was == got):
                    read[target] = was  # the same: the list held stays
                elif was is not None or got:
                    changed.add(target)
            changed.update(t for t in held.keys() - read.keys() if held[t])
            self._slow[group] = read
        if changed:
            lists = dict(self._slow_lists)
            for target in changed:
                parts = [part[target] for part in self._slow.values() if target in part]
                if parts:
                    lists[target] = [sample for part in parts for sample in part]
                else:
                    lists.pop(target, None)
            self._slow_lists = lists
        return changed

    def _users_unknown(self, found: Found) -> frozenset[Target]:
        """The targets up, read as figures, whose users are not known yet: worked out
        again for the targets that may have changed, the others as they were."""
        fresh = found.fresh
        unknown = {
            t
            for t in (found.seen if fresh is None else fresh)
            if found.seen.get(t, 0.0) > 0
            and _figures_held(self._held.get(t))
            and not summaries.users_told(self._slow_lists.get(t, ()))
        }
        if fresh is not None:
            unknown.update(t for t in self._unknown_users if t not in fresh)
        return frozenset(unknown)

    def figures(self, target: Target, fast: list[Sample], slow: list[Sample]) -> Figures:
        """What a node's figures say, read from its series; those of what changes slowly
        as last time while they are the very series held then."""
        held = self._slow_read.get(target)
        if held is None or held[0] is not slow:
            held = (slow, summaries.slow_figures(slow))
            self._slow_read[target] = held
        return summaries.figures(fast, held[1])

    def exporters(self) -> frozenset[str] | None:
        """The exporters of the targets named at the last reading of the names, or `None`
        before one (or where a target is new since: it may run another)."""
        if self._names is None or self._new_targets:
            return None
        return frozenset(self._names.exporters.values())

    def errors_due(self, down: frozenset[Target]) -> bool:
        """Whether to ask again why targets are down: the targets down changed, or it is
        time."""
        return down != self._down or self.reads % PROBE_EVERY == 0

    def errors(
        self, down: frozenset[Target], errors: dict[Target, str] | None
    ) -> dict[Target, str]:
        """Why each target down is: `errors` where just asked (then held), else as held."""
        if errors is not None:
            self._down, self._errors = down, errors
        return self._errors

    def _keep_held(self, found: Found, answered: set[Target] | None) -> None:
        """The series read replace those held of each target scraped since (`answered`,
        `None`: any target); a target down has none (they went with its scrape)."""
        since = self._since
        if since is None:
            self._held = {}
        for target in found.seen if answered is None else answered:
            seen = found.seen[target]
            if seen <= 0 or since is None or seen > since - promql.STORED_WITHIN_S:
                self._held.pop(target, None)
        self._held.update((t, samples) for t, samples in found.held.items() if samples)
        if answered is None:  # `up` read whole: a target may have gone
            self._held = {t: s for t, s in self._held.items() if t in found.seen}
        # The round's own series of a target first, then those held.
        own = {t: [*s, *self._held[t]] for t, s in found.samples.items() if t in self._held}
        found.samples.update(self._held)
        found.samples.update(own)
        self._since = found.evaluated or None
        self._exporters_asked = self._planned

    def _slow_due(self) -> tuple[int, ...]:
        """All parts until every one is held, then each every `SLOW_EVERY` refreshes, at
        different refreshes."""
        if len(self._slow) < summaries.SLOW_GROUPS:
            return tuple(range(summaries.SLOW_GROUPS))
        step = SLOW_EVERY // summaries.SLOW_GROUPS
        turn = self.reads % SLOW_EVERY
        due = turn // step
        return (due,) if turn % step == 0 and due < summaries.SLOW_GROUPS else ()


def _figures_held(samples: list[Sample] | None) -> bool:
    """Whether a target's held series are a daemon's figures (not another exporter's)."""
    if not samples:
        return False
    return samples[0].name.startswith("gpuwatch_")
