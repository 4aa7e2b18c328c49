"""A stand-in for Prometheus's HTTP API: answers the fleet's queries from exposition
fixtures as a server scraping them would, and counts what it was asked.

It knows the queries `gpuwatch.fleet.promql` writes (each family's, the per-node
families', the names query, `up` with its time, a prefilter), each optionally narrowed
to some instances or to the targets scraped after a time; any
other query is refused as Prometheus refuses a bad one."""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field, replace

from gpuwatch.fleet import node_figures, node_work, promql, summaries
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.promql import FamilyQuery
from gpuwatch.fleet.series import PREFIXES, exporter_of, target_state
from gpuwatch.fleet_model import Exporter
from gpuwatch.placement.gpus import GPUS
from gpuwatch.placement.rules import qualifying
from gpuwatch.request import IDLE_MAX_UTIL_PCT
from tests.helpers.fleet.servers import Reply

NOW = 1_795_472_800.0
_SLOW_FIGURES = frozenset(q.promql() for q in summaries.slow_plan(recorded=False))
"""The per-node figures only Prometheus computes, as a source asks them where no rule
records them."""


@dataclass
class FakeTarget:
    job: str
    instance: str
    exposition: str
    up: bool = True
    scraped_at: float = NOW - 5
    hostname: str | None = None
    """The node's last known host name (what `last_over_time` keeps after it went down)."""
    snapshot_at: float = 0.0

    @property
    def exporter(self) -> str:
        """Which exporter serves it: by its series, else (a target down) by its job."""
        found = exporter_of(list(parse_exposition(self.exposition, PREFIXES)))
        if found is not None:
            return found.value
        return next((e.value for e in Exporter if self.job.startswith(e.value[:4])), "")


@dataclass
class FakePrometheus:
    targets: list[FakeTarget]
    asked: list[str] = field(default_factory=list)
    ranges: list[dict[str, str]] = field(default_factory=list)

    def __call__(self, path: str, headers: dict[str, str]) -> Reply:
        url = urllib.parse.urlsplit(path)
        params = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/api/v1/query_range":
            self.ranges.append(params)
            return _json({"status": "success", "data": {"resultType": "matrix", "result": []}})
        if url.path != "/api/v1/query":
            return Reply(b"404 page not found", status=404)
        query = params.get("query", "")
        self.asked.append(query)
        result = self._answer(query)
        if result is None:
            return _json({"status": "error", "errorType": "bad_data", "error": "unknown query"})
        return _json({"status": "success", "data": {"resultType": "vector", "result": result}})

    def _answer(self, query: str) -> list[dict[str, object]] | None:
        matcher = _MATCHER.search(query)
        targets = self.targets
        if matcher is not None:
            pattern = re.compile(matcher[1].replace("\\\\", "\\"))
            targets = [t for t in targets if pattern.fullmatch(t.instance)]
            query = _MATCHER.sub("", query).replace("{}", "").replace(", }", "}")
        if query == summaries.PROBE:
            return []  # it records no rules: the fleet is read GPU by GPU
        if query in _SLOW_FIGURES:
            return []  # no expression is evaluated: nobody runs a process, idle or not
        if query in (promql.names(), promql.names(now=True)):
            return self._names(targets)
        if query == promql.UP_SEEN:
            return self._up_seen(targets)
        if (names := _NODE_FAMILIES.fullmatch(query)) is not None:
            compare = names[2] or ""
            return [
                s
                for name in names[1].split("|")
                for s in self._node_family(targets, FamilyQuery(name, (), compare))
            ]
        family = _family_query(query)
        return None if family is None else self._family(targets, family)

    def _family(self, targets: list[FakeTarget], query: FamilyQuery) -> list[dict[str, object]]:
        """As Prometheus evaluates one family's query over the up targets' series: an
        aggregation keeps only the labels it groups by, and drops the name."""
        found: dict[tuple[tuple[str, str], ...], float] = {}
        kept_gpus = None
        if query.only_where is not None:  # `and on (job, instance, gpu) ONLY_WHERE`
            kept_gpus = {
                (t.job, t.instance, s.labels.get("gpu"))
                for t, s in self._samples(targets, query.only_where.family)
                if _passes(s.value, query.only_where.compare)
            }
        for target, sample in self._samples(targets, query.family):
            if not _passes(sample.value, query.compare):
                continue
            if kept_gpus is not None and (
                (target.job, target.instance, sample.labels.get("gpu")) not in kept_gpus
            ):
                continue
            labels = {**sample.labels, "__name__": sample.name}
            labels |= {"job": target.job, "instance": target.instance}
            if query.keep is not None:
                kept = {"job", "instance", *query.keep}
                labels = {k: v for k, v in labels.items() if k in kept}
            key = tuple(sorted(labels.items()))
            found[key] = max(found.get(key, sample.value), sample.value)
        return [{"metric": dict(key), "value": [NOW, repr(v)]} for key, v in found.items()]

    def _samples(self, targets: list[FakeTarget], family: str) -> list[tuple[FakeTarget, Sample]]:
        return [
            (target, sample)
            for target in targets
            if target.up
            for sample in parse_exposition(target.exposition, PREFIXES)
            if sample.name == family
        ]

    def _names(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        return [
            {
                "metric": self._target_labels(t) | self._host(t) | {"exporter": t.exporter},
                "value": [NOW, repr(t.snapshot_at)],
            }
            for t in targets
            if t.exporter  # as the names query: targets with GPU series in the last hour
        ]

    def _node_family(
        self, targets: list[FakeTarget], query: FamilyQuery
    ) -> list[dict[str, object]]:
        """One family of `promql.NodeFamilies`: by target, its name kept."""
        answer = self._family(targets, query)
        return [{**a, "metric": {**a["metric"], "__name__": query.family}} for a in answer]  # type: ignore[dict-item]

    def _up_seen(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        """`timestamp(up) * (2 * up - 1)`: each target's scrape time, negative if it failed."""
        return [
            {
                "metric": self._target_labels(t),
                "value": [NOW, repr(t.scraped_at if t.up else -t.scraped_at)],
            }
            for t in targets
        ]

    @staticmethod
    def _target_labels(target: FakeTarget) -> dict[str, str]:
        return {"job": target.job, "instance": target.instance}

    @staticmethod
    def _host(target: FakeTarget) -> dict[str, str]:
        return {"hostname": target.hostname} if target.hostname else {}


def _passes(sample: float, compare: str) -> bool:
    if not compare:
        return True
    op, value = compare.split()
    if op in (">=", "<="):
        return sample >= float(value) if op == ">=" else sample <= float(value)
    return sample == float(value) if op == "==" else sample > float(value)


_MATCHER = re.compile(r'instance=~"((?:[^"\\]|\\.)*)"')
_NODE_FAMILIES = re.compile(
    r'max by \(__name__, job, instance\) \(\{__name__=~"([^"]*)"\}(?: ([<>=!]=? \S+))?\)'
)


_FAMILIES = {
    query.promql(): query
    for placement in (False, True)
    for query in (
        *promql.values(frozenset(Exporter), placement=placement),
        *promql.identity(placement),
    )
}
_FAMILIES |= {query.promql(): query for query in promql.placed(None)}


_FAMILIES |= {query.promql(): query for query in promql.available(0, IDLE_MAX_UTIL_PCT / 100)}
_FAMILIES |= {q.promql(): q for q in summaries.plan() if isinstance(q, FamilyQuery)}
_ONLY_WHERE = " and on (job, instance, gpu) "


def _family_query(query: str) -> FamilyQuery | None:
    """The family query `query` is, as the source builds them."""
    if _ONLY_WHERE in query:
        left, right = query.split(_ONLY_WHERE)
        family, only_where = _family_query(left), _family_query(right)
        if family is None or only_where is None:
            return None
        return replace(family, only_where=only_where)
    return _FAMILIES.get(query) or _at_least(query)


def _at_least(query: str) -> FamilyQuery | None:
    """A family by GPU and `uuid` where it reaches some bytes, as `promql.placed` asks
    free memory and `promql.available` available memory."""
    found = _AT_LEAST.fullmatch(query)
    return None if found is None else FamilyQuery(found[1], ("gpu", "uuid"), f">= {found[2]}")


_AT_LEAST = re.compile(r"max by \(job, instance, gpu, uuid\) \((\w+)\) >= (\d+)")


def _json(document: object) -> Reply:
    return Reply(json.dumps(document).encode(), content_type="application/json")


def with_verdicts(target: FakeTarget) -> FakeTarget:
    """`target` as a daemon of this version serves it: with its verdict on each GPU
    (`gpuwatch_memory_available_bytes`, `gpuwatch_gpus_available`), as the daemon computes
    it from its snapshot and leases."""
    samples = list(parse_exposition(target.exposition, PREFIXES))
    node = target_state(samples, fallback_name="", seen_at=NOW, now=NOW, stale_after_s=60)
    assert node.snapshot is not None
    given = {gpu.index for gpu in qualifying(GPUS, node.snapshot, node.leases)}
    lines = [
        f'gpuwatch_memory_available_bytes{{gpu="{gpu.index}",uuid="{gpu.uuid}"}} '
        f"{(gpu.memory_free_bytes or 0) if gpu.index in given else 0}\n"
        for gpu in node.snapshot.gpus
    ]
    lines.append(f'gpuwatch_gpus_available{{hostname="{node.name}"}} {len(given)}\n')
    return replace(target, exposition=target.exposition + "".join(lines))


def with_node_figures(target: FakeTarget) -> FakeTarget:
    """`target` as a daemon of this version serves it: its verdicts, and its node's own
    figures (`gpuwatch_node_*`) as the daemon computes them from its snapshot and leases."""
    target = with_verdicts(target)
    samples = list(parse_exposition(target.exposition, PREFIXES))
    node = target_state(samples, fallback_name="", seen_at=NOW, now=NOW, stale_after_s=60)
    assert node.snapshot is not None
    figures = node_figures.node_figures(node.snapshot.gpus)
    ratio = None if figures.utilization_pct is None else figures.utilization_pct / 100
    values = {
        node_figures.GPUS: figures.gpus,
        node_figures.MEMORY_FREE: figures.memory_free_bytes,
        node_figures.MEMORY_FREE_MAX: figures.most_free_bytes,
        node_figures.UTILIZATION: ratio,
        node_figures.TEMPERATURE_MAX: figures.hottest_c,
        node_figures.POWER: figures.power_w,
        node_figures.LEASES: node_figures.leases_on(node.snapshot, node.leases or ()),
    }
    if node_work.WAITERS not in target.exposition:  # the daemon tells its line, even empty
        values |= {node_work.WAITERS: 0, node_work.LONGEST_WAIT: 0.0}
    lines = "".join(
        f'{name}{{hostname="{node.name}"}} {value!r}\n'
        for name, value in values.items()
        if value is not None
    )
    return replace(target, exposition=target.exposition + lines)
