"""A stand-in for Prometheus's HTTP API: answers the fleet's queries from exposition
fixtures as a server scraping them would, and counts what it was asked."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field

from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.prometheus import QUERIES, VALUE_QUERIES, ValueQuery
from gpuwatch.fleet.series import PREFIXES
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
        kind = next((k for k, q in QUERIES.items() if q == query), None)
        if kind is None:
            return _json({"status": "error", "errorType": "bad_data", "error": "unknown query"})
        if kind in VALUE_QUERIES:
            result = self._values(VALUE_QUERIES[kind])
        else:
            result = getattr(self, f"_{kind}")()
        return _json({"status": "success", "data": {"resultType": "vector", "result": result}})

    def _values(self, query: ValueQuery) -> list[dict[str, object]]:
        """As Prometheus evaluates `query.promql()` over the up targets' series: `or`
        keeps the first of series whose labels differ only by name."""
        operands = [(query.families, None, 0.0), *query.filtered]
        found: dict[tuple[tuple[str, str], ...], float] = {}
        taken: set[tuple[tuple[str, str], ...]] = set()
        for names, op, value in operands:
            batch = self._selected(query, names, op, value)
            fresh = {key: v for key, v in batch.items() if _unnamed(key) not in taken}
            taken |= {_unnamed(key) for key in fresh}
            found |= fresh
        return [{"metric": dict(key), "value": [NOW, repr(v)]} for key, v in found.items()]

    def _selected(
        self, query: ValueQuery, names: tuple[str, ...], op: str | None, value: float
    ) -> dict[tuple[tuple[str, str], ...], float]:
        found: dict[tuple[tuple[str, str], ...], float] = {}
        for target in self.targets:
            if not target.up:
                continue
            for sample in parse_exposition(target.exposition, PREFIXES):
                if sample.name not in names or not _passes(sample.value, op, value):
                    continue
                labels = {**sample.labels, "__name__": sample.name}
                labels |= {"job": target.job, "instance": target.instance}
                if query.keep is not None:
                    kept = {"__name__", "job", "instance", *query.keep}
                    labels = {k: v for k, v in labels.items() if k in kept}
                key = tuple(sorted(labels.items()))
                found[key] = max(found.get(key, sample.value), sample.value)
        return found

    def _names(self) -> list[dict[str, object]]:
        return [
            {"metric": self._target_labels(t) | self._host(t), "value": [NOW, repr(t.snapshot_at)]}
            for t in self.targets
        ]

    def _up(self) -> list[dict[str, object]]:
        return [
            {"metric": self._target_labels(t), "value": [NOW, "1" if t.up else "0"]}
            for t in self.targets
        ]

    def _seen(self) -> list[dict[str, object]]:
        return [
            {"metric": self._target_labels(t), "value": [NOW, repr(t.scraped_at)]}
            for t in self.targets
        ]

    @staticmethod
    def _target_labels(target: FakeTarget) -> dict[str, str]:
        return {"job": target.job, "instance": target.instance}

    @staticmethod
    def _host(target: FakeTarget) -> dict[str, str]:
        return {"hostname": target.hostname} if target.hostname else {}


def _passes(sample: float, op: str | None, value: float) -> bool:
    return op is None or (sample == value if op == "==" else sample > value)


def _unnamed(key: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(item for item in key if item[0] != "__name__")


def _json(document: object) -> Reply:
    return Reply(json.dumps(document).encode(), content_type="application/json")
