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
`timestamp(up)` (and, for a gpuwatch daemon, the snapshot time it exports). Every query
of a read is evaluated at one instant, a little in the past (`promql.ROUND_BEHIND_S`), so
that all its answers are of the same scrapes. A target
whose scrape fails has `up == 0` and its series vanish: it is down, with Prometheus's
reason (`lastError` of `/api/v1/targets`, one more request only where a node is down).

Only a gpuwatch daemon too old to export what the round asks of it (its node's figures,
its verdict on each GPU) costs one more round, narrowed to it. A one-shot read keeps
nothing between reads; the fleet table's source keeps what a benchmark shows pays
(`gpuwatch.fleet.table_memory`), and every source which target each node's key stands
for, for `history` and `focus`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection

from msgspec.structs import replace

from gpuwatch.fleet import node_history, promql, summaries
from gpuwatch.fleet.fetch import Budget, HttpOptions
from gpuwatch.fleet.prom_nodes import Judge, nodes_of
from gpuwatch.fleet.promapi import DEFAULT_MAX_BYTES, PromClient
from gpuwatch.fleet.promql import Query
from gpuwatch.fleet.rounds import DETAIL, NAMES, UP, Asked, Found, Target, ask
from gpuwatch.fleet.series import claimed
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet.table_memory import TableMemory
from gpuwatch.fleet_model import Exporter, FleetState, NodeState
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.request import IDLE_MAX_UTIL_PCT

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_STALE_AFTER_S = 120.0
"""Two scrapes at Prometheus's default interval (1m), so that a node is stale only when
a scrape was missed, whatever interval the server uses up to that."""


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
        self.needs = needs or Needs()
        self._clock = clock
        self._budget = budget
        table = self.needs.per_node and not self.needs.placement
        self._memory = TableMemory(self.needs.idle_after_s) if table else None
        self._judge = (
            Judge(self.needs, stale_after_s)
            if self._memory is None
            else Judge(self.needs, stale_after_s, self._memory.figures, self._memory.nodes)
        )
        self._last = LastRead((), {})
        self._focus: frozenset[str] = frozenset()
        self._older: set[Target] = set()
        """The daemons too old to export what the read asks, as last worked out."""
        self.queries_sent = 0
        """Instant queries sent so far, for the benches."""

    @property
    def nodes_built(self) -> int:
        """Nodes built from their series so far, for the benches: the table's source builds
        again only those scraped since its last read (the others it keeps)."""
        kept = self._judge.kept
        return 0 if kept is None else kept.built

    @property
    def description(self) -> str:
        return f"prometheus {self.client.url}"

    def read(self) -> FleetState:
        """The fleet now; raises `SourceError` when the server cannot be read."""
        budget = self._budget or self.client.budget()
        found = Found()
        at = self._clock() - promql.ROUND_BEHIND_S
        self._ask(self._round(), at, budget, found)
        if self._memory is not None:
            self._memory.keep(found)
        if later := self._older_daemons(found):
            self._ask(later, at, budget, found)
        now = found.evaluated or self._clock()
        unscraped = frozenset(t for t, seen in found.seen.items() if seen <= 0)
        nodes = self._with_errors(nodes_of(self._judge, found, now), unscraped, budget)
        fleet = claimed(nodes.values())
        self._last = LastRead(fleet, nodes)
        return FleetState(taken_at=now, source=self.description, nodes=fleet)

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
        if (target := self._last.targets.get(node)) is None:
            return ()
        end = self._clock()
        step_s = max(1.0, duration_s / points)
        query = node_history.query(*target)
        matrix = self.client.query_range(query, end - duration_s, end, step_s)
        return node_history.series(matrix, self._last.uuids.get(node, {}))

    def close(self) -> None:
        """Nothing stays open between reads."""

    def _round(self) -> list[Asked]:
        """The queries of one read: targets and their names, the gpuwatch daemons' as the
        reader needs them, dcgm-exporter's and nvidia_gpu_exporter's; for the table, what
        its memory says is due (`TableMemory.plan`: of most, the targets scraped since the
        last refresh), and the nodes in focus GPU by GPU."""
        needs = self.needs
        exporters = {
            Exporter.DCGM: promql.dcgm_values(placement=needs.placement),
            Exporter.NVIDIA_GPU_EXPORTER: promql.smi_values(placement=needs.placement),
        }
        if self._memory is None:
            families = [query for queries in exporters.values() for query in queries]
            plan = [*families, *self._gpuwatch_plan()]
            return [Asked(UP), Asked(NAMES), *(Asked(query) for query in plan)]
        asked = self._memory.plan(exporters)
        focused = {self._last.targets[key][1] for key in self._focus if key in self._last.targets}
        if focused:
            matcher = promql.instances(focused)
            detail = promql.gpuwatch_values(placement=False)
            asked += [Asked(query, DETAIL, matcher) for query in detail]
        return asked

    def _gpuwatch_plan(self) -> list[Query]:
        needs = self.needs
        if needs.placement and needs.verdicts:
            return promql.verdicts(needs.free_bytes, IDLE_MAX_UTIL_PCT / 100)
        return list(promql.gpuwatch_values(placement=needs.placement, mig=needs.mig))

    def _ask(self, asked: list[Asked], at: float, budget: Budget, found: Found) -> None:
        self.queries_sent += len(asked)
        ask(self.client, asked, at, budget, found)

    def _older_daemons(self, found: Found) -> list[Asked]:
        """The GPU-by-GPU queries of the daemons that answered the round with neither
        their node's figures nor their verdicts (a version before them), narrowed to
        them: nothing where there are none."""
        needs = self.needs
        if needs.placement and needs.verdicts:
            marker = promql.AVAILABLE_GPUS
        elif self._memory is not None:
            marker = promql.NODE_GPUS
        else:
            return []
        # The table's read: worked out again for the targets that may have changed only.
        fresh = found.fresh
        older = {
            target
            for target in (found.exporters if fresh is None else fresh | self._older)
            if found.exporters.get(target) == Exporter.GPUWATCH
            and found.seen.get(target, -1.0) > 0
            and not summaries.told(found.samples.get(target, []), marker)
        }
        self._older = older
        if not older:
            return []
        queries = promql.gpuwatch_values(placement=needs.placement, mig=needs.mig)
        matcher = promql.instances(instance for _, instance in older)
        return [Asked(query, DETAIL, matcher) for query in queries]

    def _with_errors(
        self, nodes: dict[Target, NodeState], unscraped: frozenset[Target], budget: Budget
    ) -> dict[Target, NodeState]:
        """The nodes, each that Prometheus cannot scrape (`unscraped`) with why (its
        `lastError`), where the reader needs it: one request more where there is one."""
        down = unscraped & nodes.keys()
        if not down or not self.needs.errors:
            return nodes
        memory = self._memory
        errors = None
        if memory is None or memory.errors_due(down):
            errors = self.client.scrape_errors(sorted({job for job, _ in down}), budget=budget)
        if memory is not None:
            errors = memory.errors(down, errors)
        found = errors or {}
        return nodes | {t: _with_error(nodes[t], found.get(t)) for t in down}


class LastRead:
    """A read's nodes (by target, and as the fleet has them), and what `history` and
    `focus` look up in them, worked out where first asked: the table's refresh does not
    ask (a node's detail screen does, of one node)."""

    def __init__(self, fleet: tuple[NodeState, ...], nodes: dict[Target, NodeState]) -> None:
        self._fleet, self._nodes = fleet, nodes

    @functools.cached_property
    def targets(self) -> dict[str, Target]:
        """Which target each node's key stands for."""
        by_place = {(node.job, node.target): target for target, node in self._nodes.items()}
        return {node.key: by_place[(node.job, node.target)] for node in self._fleet}

    @functools.cached_property
    def uuids(self) -> dict[str, dict[str, int]]:
        """Each node's GPUs' indices by UUID, by the node's key."""
        return {
            node.key: {gpu.uuid: gpu.index for gpu in node.snapshot.gpus if gpu.uuid}
            for node in self._fleet
            if node.snapshot is not None
        }


def _with_error(node: NodeState, error: str | None) -> NodeState:
    return node if error is None or node.up else replace(node, error=f"{node.error}: {error}")
