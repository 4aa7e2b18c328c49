"""Prometheus's HTTP API (`/api/v1/query`, `/api/v1/query_range`) as Prometheus, Thanos,
VictoriaMetrics and Mimir serve it, with every way a server can fail to be one turned
into a `SourceError` of one line.

An instant query's answer is decoded by msgspec straight into its series (`_Series`),
not by the standard library's `json` into objects then walked: at 10,000 nodes the answers
of `gpuwatch where` are 14 MB, which become samples in 0.20 CPU-s the one way and 0.07 the
other, a sixth of the command's CPU time (bench/fleet_scale.py).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any, NoReturn

import msgspec

from gpuwatch.errors import InvalidValueError, SourceError
from gpuwatch.fleet.exposition import Sample, parse_value
from gpuwatch.fleet.fetch import Answer, Budget, HttpOptions, Request, fetch_all
from gpuwatch.fleet.names import safe_name, shown_address

DEFAULT_MAX_BYTES = 256 << 20
"""All the answers of one read together. Read GPU by GPU, 10,000 nodes of 8 GPUs are about
100 MiB of JSON, read in about 460 MiB of memory (bench/fleet_scale.py): the cap lets such
a fleet through with room for more processes per GPU, and keeps a server gone wrong to
about a GiB of the reader's memory."""
MAX_GET_URL_CHARS = 4000
"""Longer queries are POSTed: nginx, for one, refuses request lines over 8 KiB."""


class _Series(msgspec.Struct, gc=False):
    """One series of an instant vector as the API writes it: its labels, and its
    evaluation time and value (a text: "NaN" and "+Inf" are values too). Not tracked by
    the garbage collector, as `Sample` is not."""

    metric: dict[str, str]
    value: tuple[float, str]


class _Vector(msgspec.Struct):
    result_type: str = msgspec.field(name="resultType")
    result: list[_Series] = msgspec.field(default_factory=list)


class _VectorDocument(msgspec.Struct):
    """An instant query's answer, decoded at once into its series: an answer of 10,000
    nodes holds 100,000 of them."""

    status: str
    data: _Vector | None = None


_VECTOR_DOCUMENT = msgspec.json.Decoder(_VectorDocument)


class Point(msgspec.Struct, frozen=True):
    """One series of a range query's matrix, as the API returns it."""

    labels: dict[str, str]
    values: list[tuple[float, float]]
    """(timestamp, value) pairs, finite values only."""


def base_url(text: str) -> str:
    """`text` as the root of the API, checked: http(s), a host, no credentials."""
    shown = shown_address(text)
    parts = urllib.parse.urlsplit(text.strip())
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
        or not text.isprintable()
    ):
        raise InvalidValueError(
            f"Prometheus URL {shown!r}: give http(s)://HOST:PORT, e.g. http://prometheus:9090 "
            "(credentials go in a file, never in the URL)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise InvalidValueError(f"Prometheus URL {shown!r}: the port is not a number") from None
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class PromClient:
    """Runs PromQL against one server, several queries at once, each read within a
    `Budget` of time and bytes (by default one of its own: `budget()`)."""

    def __init__(self, url: str, *, options: HttpOptions, timeout_s: float, max_bytes: int) -> None:
        self.url = base_url(url)
        self.options, self.timeout_s, self.max_bytes = options, timeout_s, max_bytes
        self.bytes_read = 0
        """Bytes of JSON read so far (after decompression), for the benches."""

    def budget(self) -> Budget:
        """A read's budget from now: this client's timeout, and its bytes for all of the
        read's answers together."""
        return Budget(self.timeout_s, self.max_bytes)

    def samples(
        self,
        queries: Sequence[str],
        names: Sequence[str],
        *,
        at: float | None = None,
        budget: Budget | None = None,
    ) -> list[tuple[float, list[Sample]]]:
        """Each instant query's evaluation time and vector as `Sample`s named `names[i]`
        (an aggregation's answer carries no `__name__`), or by their `__name__` where
        `names[i]` is "", all sent at once, all evaluated at `at` where given (else each
        when the server reads it). An answer whose series are not all of the API's
        shape is refused whole (`SourceError`), as one that is not JSON is."""
        instant = {} if at is None else {"time": f"{at:.3f}"}
        answers = self._get([("query", {"query": q, **instant}) for q in queries], budget)
        # Each answer let go once decoded: a large fleet's are tens of MiB, not to be held
        # beside all of their samples.
        answers.reverse()
        return [self._named(answers.pop(), name) for name in names]

    def scrape_errors(
        self, jobs: Sequence[str], *, budget: Budget | None = None
    ) -> dict[tuple[str, str], str]:
        """Why each target of `jobs` that Prometheus cannot scrape fails, by (job,
        instance): its `lastError` (`/api/v1/targets`), one printable line. Empty where
        the server does not say (Thanos, Mimir and VictoriaMetrics serve no targets):
        only the reason is missing then, never a node."""
        params = {"state": "active", **({"scrapePool": jobs[0]} if len(jobs) == 1 else {})}
        (answer,) = self._get([("targets", params)], budget)
        try:
            data = self._data(answer)
        except SourceError:
            return {}
        errors: dict[tuple[str, str], str] = {}
        for target in _list(data.get("activeTargets")):
            if not isinstance(target, dict) or not isinstance(target.get("labels"), dict):
                continue
            labels, error = target["labels"], target.get("lastError")
            job, instance = labels.get("job"), labels.get("instance")
            if isinstance(error, str) and error and isinstance(job, str) and job in jobs:
                errors[(job, str(instance))] = safe_name(error.splitlines()[0])[:300]
        return errors

    def query_range(
        self, query: str, start: float, end: float, step_s: float, *, budget: Budget | None = None
    ) -> list[Point]:
        """A range query's matrix."""
        params = {
            "query": query,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        data = self._data(self._get([("query_range", params)], budget)[0])
        if data.get("resultType") != "matrix":
            raise self._error("answers a range query without a matrix")
        return [p for item in _list(data.get("result")) if (p := _series(item))]

    def _get(
        self, calls: Sequence[tuple[str, dict[str, str]]], budget: Budget | None
    ) -> list[Answer]:
        """The answers to each (endpoint, parameters), sent at once. A long query (one
        narrowed to many targets) is POSTed as a form, as the API allows: proxies in
        front of Prometheus refuse request lines over a few KiB."""
        requests = []
        for endpoint, params in calls:
            url, form = f"{self.url}/api/v1/{endpoint}", urllib.parse.urlencode(params)
            long = len(url) + 1 + len(form) > MAX_GET_URL_CHARS
            requests.append(Request(url, form.encode()) if long else Request(f"{url}?{form}"))
        answers = fetch_all(
            requests,
            options=self.options,
            budget=budget or self.budget(),
            then=_same,
            headers={"Accept": "application/json"},
        )
        self.bytes_read += sum(len(a.body) for a in answers)
        return answers

    def _named(self, answer: Answer, name: str) -> tuple[float, list[Sample]]:
        try:
            document = _VECTOR_DOCUMENT.decode(answer.body) if answer.error is None else None
        except msgspec.DecodeError:
            document = None
        if document is None or document.status != "success" or document.data is None:
            self._not_a_vector(answer)
        assert document is not None and document.data is not None
        if document.data.result_type != "vector":
            raise self._error("answers an instant query without a vector")
        return _samples(document.data.result, name)

    def _not_a_vector(self, answer: Answer) -> NoReturn:
        """Raises what an answer that is not an instant query's vector is instead."""
        data = self._data(answer)
        if data.get("resultType") != "vector":
            raise self._error("answers an instant query without a vector")
        raise self._error("answers a vector whose series are not of the API's shape")

    def _data(self, answer: Answer) -> dict[str, Any]:
        if answer.error is not None:
            raise self._error(f"cannot be read: {answer.error}")
        document = self._document(answer)
        if document.get("status") != "success":
            reason = safe_name(str(document.get("error", "no reason given")))[:200]
            raise self._error(f"refuses the query: {reason}")
        data = document.get("data")
        if not isinstance(data, dict):
            raise self._error("answers without data: is it Prometheus's API?")
        return data

    def _document(self, answer: Answer) -> dict[str, Any]:
        if answer.status == 404:
            raise self._error("has no /api/v1 (HTTP 404): is the URL Prometheus's root?")
        if answer.status in (401, 403):
            raise self._error(f"refuses these credentials (HTTP {answer.status})")
        if "html" in answer.content_type.lower() or answer.body.lstrip()[:1] == b"<":
            raise self._error(
                f"answers with a web page (HTTP {answer.status}), not Prometheus's API"
            )
        try:
            document = msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            raise self._error(
                f"answers HTTP {answer.status} without JSON: is it Prometheus?"
            ) from None
        if not isinstance(document, dict):
            raise self._error("answers JSON that is not Prometheus's API")
        return document

    def _error(self, what: str) -> SourceError:
        return SourceError(f"Prometheus at {self.url} {what}")


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _series(item: object) -> Point | None:
    """One series of a matrix, or `None` when it is not the API's shape."""
    if type(item) is not dict or type(metric := item.get("metric")) is not dict:
        return None
    values = [pair for entry in _list(item.get("values")) if (pair := _pair(entry)) is not None]
    # JSON keys are always texts; a value that is not one is dropped.
    if not all(type(value) is str for value in metric.values()):
        metric = {k: v for k, v in metric.items() if type(v) is str}
    return Point(metric, values) if values else None


def _samples(result: list[_Series], name: str) -> tuple[float, list[Sample]]:
    """The vector's series as samples (finite values only), and its newest timestamp:
    the hot loop of a refresh (a series per GPU and family)."""
    samples: list[Sample] = []
    append = samples.append
    evaluated = 0.0
    for series in result:
        at, text = series.value
        try:
            value = float(text)
        except ValueError:
            continue
        if value - value != 0:
            continue  # NaN or infinite
        metric = series.metric
        append(Sample(name or metric.get("__name__", ""), metric, value))
        evaluated = max(evaluated, at)
    return float(evaluated), samples


def _pair(entry: object) -> tuple[float, float] | None:
    if type(entry) is not list or len(entry) != 2:
        return None
    at, text = entry
    if type(text) is not str or type(at) not in (int, float):
        return None
    value = parse_value(text)
    return None if value is None else (float(at), value)


def _same(answer: Answer) -> Answer:
    return answer
