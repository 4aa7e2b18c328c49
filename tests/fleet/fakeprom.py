"""A stand-in for Prometheus's HTTP API: answers the fleet's queries from exposition
fixtures as a server scraping them would, and counts what it was asked.

It knows the queries `gpuwatch.fleet.promql` writes (each family's, the names query,
`up`, `timestamp(up)`, a prefilter), each optionally narrowed to some instances or to
the targets scraped after a time; any
other query is refused as Prometheus refuses a bad one."""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field

from gpuwatch.fleet import promql, summaries
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.nodes import Exporter
from gpuwatch.fleet.promql import FamilyQuery
from gpuwatch.fleet.series import PREFIXES, exporter_of
from tests.fleet.servers import Reply

NOW = 1_795_472_800.0


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
            query = _MATCHER.sub("", query)
        if (after := _SCRAPED_AFTER.fullmatch(query)) is not None:
            since = float(after[2])
            targets = [t for t in targets if t.scraped_at > since]
            query = after[1]
        if query == summaries.PROBE:
            return []  # it records no rules: the fleet is read GPU by GPU
        if query == promql.names():
            return self._names(targets)
        if query in ("up", "timestamp(up)"):
            return self._up(targets) if query == "up" else self._seen(targets)
        if (prefilter := _prefilter(query)) is not None:
            return self._prefiltered(targets, prefilter)
        family = _FAMILIES.get(query)
        return None if family is None else self._family(targets, family)

    def _family(self, targets: list[FakeTarget], query: FamilyQuery) -> list[dict[str, object]]:
        """As Prometheus evaluates one family's query over the up targets' series: an
        aggregation keeps only the labels it groups by, and drops the name."""
        found: dict[tuple[tuple[str, str], ...], float] = {}
        for target, sample in self._samples(targets, query.family):
            if not _passes(sample.value, query.compare):
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

    def _prefiltered(
        self, targets: list[FakeTarget], prefilter: dict[str, str | None]
    ) -> list[dict[str, object]]:
        free, used, util, gpus = (prefilter[k] or "0" for k in ("free", "used", "util", "gpus"))
        used, util = (prefilter["used"], prefilter["util"])

        def values(family: str) -> dict[tuple[str, str, str], float]:
            return {
                (t.job, t.instance, s.labels.get("gpu", "")): s.value
                for t, s in self._samples(targets, family)
            }

        passing = {k for k, v in values("gpuwatch_memory_free_bytes").items() if v >= float(free)}
        if used is not None:
            passing -= {
                k for k, v in values("gpuwatch_memory_used_bytes").items() if v > float(used)
            }
        if util is not None:
            passing -= {
                k for k, v in values("gpuwatch_utilization_ratio").items() if v > float(util)
            }
        counts: dict[tuple[str, str], int] = {}
        for job, instance, _ in passing:
            counts[(job, instance)] = counts.get((job, instance), 0) + 1
        return [
            {"metric": {"job": job, "instance": instance}, "value": [NOW, str(count)]}
            for (job, instance), count in counts.items()
            if count >= int(gpus)
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

    def _up(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        return [
            {"metric": self._target_labels(t), "value": [NOW, "1" if t.up else "0"]}
            for t in targets
        ]

    def _seen(self, targets: list[FakeTarget]) -> list[dict[str, object]]:
        return [
            {"metric": self._target_labels(t), "value": [NOW, repr(t.scraped_at)]} for t in targets
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
    return sample == float(value) if op == "==" else sample > float(value)


_MATCHER = re.compile(r'\{instance=~"((?:[^"\\]|\\.)*)"\}')
_SCRAPED_AFTER = re.compile(r"\((.*)\) and on \(job, instance\) \(timestamp\(up\) > ([\d.]+)\)")
_PREFILTER = {
    "free": re.compile(r"gpuwatch_memory_free_bytes >= (\d+)"),
    "used": re.compile(r"gpuwatch_memory_used_bytes > (\d+)"),
    "util": re.compile(r"gpuwatch_utilization_ratio > ([\d.e-]+)"),
    "gpus": re.compile(r"\) >= (\d+)$"),
}


def _prefilter(query: str) -> dict[str, str | None] | None:
    """A prefilter's bounds, or `None` where `query` is not one."""
    if not query.startswith("count by (job, instance) ("):
        return None
    found = {key: pattern.search(query) for key, pattern in _PREFILTER.items()}
    return {key: match[1] if match else None for key, match in found.items()}


_FAMILIES = {
    query.promql(): query
    for placement in (False, True)
    for query in (
        *promql.values(frozenset(Exporter), placement=placement),
        *promql.identity(placement),
    )
}


def _json(document: object) -> Reply:
    return Reply(json.dumps(document).encode(), content_type="application/json")
