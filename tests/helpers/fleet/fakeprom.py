"""A stand-in for Prometheus's HTTP API: answers the fleet's queries from exposition
fixtures as a server scraping them would, and counts what it was asked.

It knows the queries `gpuwatch.fleet.promql` writes (each family's, the per-node
families', the names query, `up` with its time, a prefilter, dcgm-exporter's GPU
instances), each optionally narrowed to some instances, and `/api/v1/targets`; any
other query is refused as Prometheus refuses a bad one."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from gpuwatch import node_figures
from gpuwatch.fleet import node_work, promql, summaries
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
_USER_FIGURES = frozenset(
    q.promql()
    for group in summaries.USER_GROUPS
    for q in summaries.slow_plan(recorded=False, group=group)
)
"""Of those, each user's GPUs and memory: as Prometheus answers them where nobody runs a
process, `NO_USER` for each node scraped."""
_USER_GPUS_QUERY = summaries.slow_plan(recorded=False, group=0)[0].promql()
"""Of those, each user's GPUs (the other, each user's memory)."""


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
    labels: dict[str, str] = field(default_factory=dict)
    """The labels Prometheus gives every series of the target (its `up`'s)."""
    last_error: str = ""
    """Why its last scrape failed, as `/api/v1/targets` says."""
    before: FakeTarget | None = None
    """The target as its scrape before this one left it: what a query evaluated at a
    time before `scraped_at` sees."""
    honor_labels: bool = False
    """Whether the exporter's labels win over the target's (else they are renamed
    `exported_NAME`), as the scrape config's `honor_labels` says."""

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
    arriving: Callable[[str], None] | None = None
    """Called with each instant query before it is answered, beside the others (one that
    waits for another's answer)."""
    answered: Callable[[str], None] | None = None
    """Called with each instant query once it is answered (a scrape stored between two
    queries of one read), one query at a time."""
    now: float = NOW
    """Its evaluation time, which every answer carries."""
    series_sent: list[tuple[str, int]] = field(default_factory=list)
    """Each instant query answered, with the number of series its answer held."""
    users_evaluated: bool = False
    """Whether it evaluates each user's GPUs and memory from the daemons' process series,
    as Prometheus does; else it answers that nobody runs a process anywhere."""
    _one_at_a_time: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, path: str, headers: dict[str, str]) -> Reply:
        url = urllib.parse.urlsplit(path)
        params = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/api/v1/query_range":
            self.ranges.append(params)
            return _json({"status": "success", "data": {"resultType": "matrix", "result": []}})
        if url.path == "/api/v1/targets":
            self.asked.append("targets")
            return _json({"status": "success", "data": {"activeTargets": self._targets()}})
        if url.path != "/api/v1/query":
            return Reply(b"404 page not found", status=404)
        query = params.get("query", "")
        if self.arriving is not None:
            self.arriving(query)
        with self._one_at_a_time:
            self.asked.append(query)
            result = self._answer(query, float(params["time"]) if "time" in params else None)
            self.series_sent.append((query, -1 if result is None else len(result)))
            if self.answered is not None:
                self.answered(query)
        if result is None:
            return _json({"status": "error", "errorType": "bad_data", "error": "unknown query"})
        return _json({"status": "success", "data": {"resultType": "vector", "result": result}})

    def _answer(self, query: str, at: float | None) -> list[dict[str, object]] | None:
        targets = [_as_at(t, at) for t in self.targets]
        if (since := _SCRAPED_SINCE.fullmatch(query)) is not None:
            # Only the targets scraped since then (a scrape takes no time here).
            query = since[1]
            targets = [t for t in targets if t.scraped_at > float(since[2])]
        matcher = _MATCHER.search(query)
        if matcher is not None:
            pattern = re.compile(matcher[1].replace("\\\\", "\\"))
            targets = [t for t in targets if pattern.fullmatch(t.instance)]
            query = _MATCHER.sub("", query).replace("{}", "").replace(", }", "}")
        if query in _USER_FIGURES:
            return self._users(targets, gpus=query == _USER_GPUS_QUERY)
        if query == summaries.PROBE or query in _SLOW_FIGURES:
            # It records no rules, and evaluates no other expression: none is idle.
            return []
        fixed = {
            promql.names(): self._names,
            promql.DCGM_DEVICES.promql(): self._devices,
            promql.UP_SEEN: self._up_seen,
        }
        if query in fixed:
            return fixed[query](targets)
        if (names := _FAMILIES_BY.fullmatch(query)) is not None:
            keep = tuple(label for label in (names[1] or "").split(", ") if label)
            compare = names[3] or ""
            return [
                s
                for name in names[2].split("|")
                for s in self._node_family(targets, FamilyQuery(name, keep, compare))
            ]
        if (names := _FAMILIES_WHOLE.fullmatch(query)) is not None:
            return [
                s
                for name in names[1].split("|")
                for s in self._node_family(targets, FamilyQuery(name))
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
            labels = {**self._stored(target, sample.labels), "__name__": sample.name}
            if query.keep is not None:
                kept = {"job", "instance", *query.keep}
                labels = {k: v for k, v in labels.items() if k in kept}
            key = tuple(sorted(labels.items()))
            found[key] = max(found.get(key, sample.value), sample.value)
        return [{"metric": dict(key), "value": [self.now, repr(v)]} for key, v in found.items()]

    def _no_users(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        """`NO_USER` for each target scraped (with GPUs): nobody runs a process here."""
        scraped = {(t.job, t.instance) for t, _ in self._samples(targets, "gpuwatch_gpu_info")}
        value = repr(summaries.NO_USER)
        return [
            {"metric": {"job": job, "instance": instance}, "value": [self.now, value]}
            for job, instance in sorted(scraped)
        ]

    def _users(self, targets: list[FakeTarget], *, gpus: bool) -> list[dict[str, object]]:
        """Each user's GPUs (`gpus`) or memory on each node, by its processes' series where
        it evaluates them (`users_evaluated`); `NO_USER` for a node scraped where nobody
        runs one."""
        gpus_of: dict[tuple[str, str, str], set[str]] = {}
        memory_of: dict[tuple[str, str, str], float] = {}
        processes = "gpuwatch_process_memory_bytes"
        for target, sample in self._samples(targets, processes) if self.users_evaluated else ():
            key = (target.job, target.instance, sample.labels.get("user", ""))
            gpus_of.setdefault(key, set()).add(sample.labels.get("gpu", ""))
            memory_of[key] = memory_of.get(key, 0.0) + sample.value
        told: list[dict[str, object]] = [
            {
                "metric": {"job": job, "instance": instance, "user": user},
                "value": [self.now, repr(float(len(held)) if gpus else memory_of[key])],
            }
            for key, held in sorted(gpus_of.items())
            for job, instance, user in [key]
        ]
        users = {(job, instance) for job, instance, _ in gpus_of}
        nobody = [s for s in self._no_users(targets) if _target_of(s) not in users]
        return told + nobody

    def _samples(self, targets: list[FakeTarget], family: str) -> list[tuple[FakeTarget, Sample]]:
        return [
            (target, sample)
            for target in targets
            if target.up
            for sample in parse_exposition(target.exposition, PREFIXES)
            if sample.name == family
        ]

    def _devices(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        """`group by (job, instance, KEEP) ({__name__=~"DCGM_FI_.+"})`."""
        found: dict[tuple[tuple[str, str], ...], float] = {}
        keep = {"job", "instance", *promql.DCGM_DEVICES.keep}
        for target in targets:
            if not target.up:
                continue
            for sample in parse_exposition(target.exposition, PREFIXES):
                if sample.name.startswith("DCGM_FI_"):
                    labels = self._stored(target, sample.labels)
                    found[tuple(sorted((k, v) for k, v in labels.items() if k in keep))] = 1.0
        return [{"metric": dict(key), "value": [self.now, "1"]} for key in found]

    def _targets(self) -> list[dict[str, object]]:
        return [
            {
                "labels": self._scraped_labels(t),
                "health": "up" if t.up else "down",
                "lastError": "" if t.up else t.last_error,
            }
            for t in self.targets
        ]

    def _names(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        return [
            {
                "metric": self._target_labels(t) | self._host(t) | {"exporter": t.exporter},
                "value": [self.now, repr(t.snapshot_at)],
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
                "metric": self._scraped_labels(t),
                "value": [self.now, repr(t.scraped_at if t.up else -t.scraped_at)],
            }
            for t in targets
        ]

    @staticmethod
    def _target_labels(target: FakeTarget) -> dict[str, str]:
        return {"job": target.job, "instance": target.instance}

    def _stored(self, target: FakeTarget, labels: dict[str, str]) -> dict[str, str]:
        """A scraped series' labels as Prometheus stores them: the target's added, and
        where both have one, the exporter's winning (`honor_labels`) or renamed
        `exported_NAME` (as Prometheus's scrape loop does, whatever the two values)."""
        own = self._scraped_labels(target)
        if target.honor_labels:
            return {**own, **labels}
        renamed = {f"exported_{k}" if k in own else k: v for k, v in labels.items()}
        return {**renamed, **own}

    @staticmethod
    def _scraped_labels(target: FakeTarget) -> dict[str, str]:
        """What Prometheus adds to every series of the target: its job, instance and
        labels, the target's winning (`honor_labels: false`) over the exporter's, whose
        label of the same name becomes `exported_NAME`."""
        return {**target.labels, "job": target.job, "instance": target.instance}

    @staticmethod
    def _host(target: FakeTarget) -> dict[str, str]:
        """Its host labels, as its series said them (or as `hostname` says)."""
        if target.hostname:
            return {"hostname": target.hostname}
        for sample in parse_exposition(target.exposition, PREFIXES):
            found = {k: v for k, v in sample.labels.items() if k in ("hostname", "Hostname")}
            if found:
                return found
        return {}


def _as_at(target: FakeTarget, at: float | None) -> FakeTarget:
    """The target as a query evaluated at `at` (`None`: now) sees it."""
    while at is not None and target.scraped_at > at and target.before is not None:
        target = target.before
    return target


def _passes(sample: float, compare: str) -> bool:
    if not compare:
        return True
    op, value = compare.split()
    if op in (">=", "<="):
        return sample >= float(value) if op == ">=" else sample <= float(value)
    return sample == float(value) if op == "==" else sample > float(value)


_SCRAPED_SINCE = re.compile(
    r"\((.*)\) and on \(job, instance\) \(timestamp\(up\) \+ scrape_duration_seconds > "
    r"([0-9.]+)\)"
)
_MATCHER = re.compile(r'instance=~"((?:[^"\\]|\\.)*)"')
_FAMILIES_BY = re.compile(
    r'max by \(__name__, job, instance(?:, ([^)]*))?\) \(\{__name__=~"([^"]*)"\}'
    r"(?: ([<>=!]=? \S+))?\)"
)
_FAMILIES_WHOLE = re.compile(r'\{__name__=~"([^"]*)"\}')


_FAMILIES = {
    query.promql(): query
    for placement in (False, True)
    for query in (
        *promql.gpuwatch_values(placement=placement),
        *promql.gpuwatch_values(placement=placement, mig=False),
        *promql.dcgm_values(placement=placement),
        *promql.smi_values(placement=placement),
    )
    if isinstance(query, FamilyQuery)
}
_VERDICTS = promql.verdicts(0, IDLE_MAX_UTIL_PCT / 100)
_FAMILIES |= {query.promql(): query for query in _VERDICTS if isinstance(query, FamilyQuery)}
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
    return dataclasses.replace(target, exposition=target.exposition + "".join(lines))


def with_node_figures(target: FakeTarget) -> FakeTarget:
    """`target` as a daemon of this version serves it: its verdicts, and its node's own
    figures (`gpuwatch_node_*`) as the daemon computes them from its snapshot and leases."""
    target = with_verdicts(target)
    samples = list(parse_exposition(target.exposition, PREFIXES))
    node = target_state(samples, fallback_name="", seen_at=NOW, now=NOW, stale_after_s=60)
    assert node.snapshot is not None
    figures = node_figures.node_figures(node.snapshot.gpus, node.snapshot.mig_devices)
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
    return dataclasses.replace(target, exposition=target.exposition + lines)


TARGET_LABELS = ("container", "endpoint", "namespace", "pod", "service")
"""The labels a Kubernetes ServiceMonitor gives every series of a target."""


def targets_of_answers(*answers: dict[str, Any]) -> list[FakeTarget]:
    """The targets whose series recorded `/api/v1/query` answers hold, each serving them
    as stored (its job scraping with `honor_labels`, so that they are stored again as
    they were): a target's own labels are those most of its series carry."""
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for answer in answers:
        for item in answer["data"]["result"]:
            metric = item["metric"]
            series.setdefault((metric["job"], metric["instance"]), []).append(item)
    targets = []
    for (job, instance), items in sorted(series.items()):
        owns = Counter(
            tuple((k, item["metric"].get(k, "")) for k in TARGET_LABELS) for item in items
        )
        own = dict(owns.most_common(1)[0][0])
        lines = [_line(item) for item in items]
        at = max(float(item["value"][0]) for item in items)
        targets.append(
            FakeTarget(job, instance, "".join(lines), scraped_at=at, labels=own, honor_labels=True)
        )
    return targets


def _line(item: dict[str, Any]) -> str:
    metric = item["metric"]
    labels = ",".join(
        f'{k}="{v}"' for k, v in sorted(metric.items()) if k not in ("__name__", "job", "instance")
    )
    return f"{metric['__name__']}{{{labels}}} {item['value'][1]}\n"


def _target_of(series: dict[str, Any]) -> tuple[str, str]:
    return series["metric"]["job"], series["metric"]["instance"]
