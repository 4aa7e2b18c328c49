"""A stand-in for Prometheus's HTTP API: answers the fleet's four queries from exposition
fixtures as a server scraping them would, and counts what it was asked."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, field

from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.prometheus import QUERIES
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
        result = getattr(self, f"_{kind}")()
        return _json({"status": "success", "data": {"resultType": "vector", "result": result}})

    def _values(self) -> list[dict[str, object]]:
        result = []
        for target in self.targets:
            if not target.up:
                continue
            for sample in parse_exposition(target.exposition, PREFIXES):
                labels = {**sample.labels, "__name__": sample.name}
                labels |= {"job": target.job, "instance": target.instance}
                result.append({"metric": labels, "value": [NOW, repr(sample.value)]})
        return result

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


def _json(document: object) -> Reply:
    return Reply(json.dumps(document).encode(), content_type="application/json")
