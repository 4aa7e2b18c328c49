"""A Prometheus stand-in for the fleet benches: one process, the standard library's HTTP
server, that answers PromQL over the pages of N targets as a Prometheus scraping them
every `--scrape-interval` seconds would, without scraping anything.

Why a stand-in: a real Prometheus scraping 10,000 targets, and the processes serving
them, do not fit a 2-core machine beside the client measured. Its pages:

- gpuwatch daemons (89 %): 8 H100s each, as this checkout's daemon renders them
  (`gpuwatch.daemon.metrics` through bench/fleet_nodes.py: a third of the templates with
  Slurm jobs); 24 templates, each node one of them with its own `hostname` and uuids;
- dcgm-exporter (8 %) and nvidia_gpu_exporter (2 %): the recorded pages of
  tests/fleet/data/recorded/ (their sources: that folder's README.md), each node one of
  them with its own `Hostname`/`hostname` (a dcgm-exporter pod's own name kept);
- down targets (1 %): never scraped, only `up` 0 (job `gpuwatch`).

Each target has its own phase in the scrape interval: at any evaluation time its last
scrape is the latest `phase + k * interval` before it, so a read every 2 s at a 15 s
interval finds about 13 % of the targets scraped since the read before. A daemon's
`gpuwatch_sample_timestamp_seconds` is its scrape's time less 0.5 s; other values are
the pages' own. The history is that of a Prometheus that has scraped these pages, alike,
for hours: a range (`x[1h]`) or `offset` finds the value of now.

PromQL: the subset gpuwatch sends (`gpuwatch.fleet.promql`, `gpuwatch.fleet.summaries`),
parsed and evaluated as Prometheus does: selectors with `=`, `!=`, `=~`, `!~`, ranges
and `offset`; `max`, `min`, `sum`, `count`, `group`, `avg` by labels; arithmetic and
comparisons (with `bool`) between scalars and vectors, one-to-one with `on`/`ignoring`;
`and`, `or`, `unless` with `on`; `timestamp`, `label_replace`, `*_over_time`, `vector`.
Anything else is refused as Prometheus refuses a bad query (HTTP 400, `bad_data`).
`/api/v1/targets` lists every target, `/api/v1/query_range` answers no series, and
`/pages/INSTANCE` serves a target's page (for a real Prometheus to scrape).

Checked against a real Prometheus: `python bench/prom_standin.py --check 30` serves 30
targets' pages (the same mix: 26 gpuwatch daemons, 2 dcgm-exporter, 1 nvidia_gpu_exporter,
1 down), lets Debian's `prometheus` scrape them (each target's `instance` the stand-in's),
records every query `gpuwatch where -n 2`, `where --max-util 50`, `fleet --json` and
`fleet --once` send the stand-in, and sends each to both: the answers hold the same series
with the same values, times aside (scrape times and a daemon's snapshot time differ between
the two by when each scraped). Left out: the queries with `offset 10m` (idle holders),
which a Prometheus that started a minute ago cannot answer yet, and the screen's narrowing
to targets scraped since its last read (which targets those are depends on each server's
scrape phases). Run on this machine: all 49 queries agreed.

Run: python bench/prom_standin.py --nodes N [--scrape-interval 15] [--port 0]
     python bench/prom_standin.py --check 30
On start it prints one JSON line, `{"url": ...}`, and serves until its standard input
ends (or SIGTERM).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _fleet import Prometheus as RealPrometheus
from _fleet import gpuwatch_command
from fleet_nodes import Node, draw_node

from gpuwatch.fleet.exposition import parse_exposition

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "fleet" / "data" / "recorded"
DCGM_PAGES = tuple(sorted(p.name for p in RECORDED.glob("dcgm-exporter*.prom")))
SMI_PAGES = tuple(sorted(p.name for p in RECORDED.glob("nvidia-gpu-exporter*.prom")))
TEMPLATES = 24
GPUS = 8
STAMP = "gpuwatch_sample_timestamp_seconds"
_PREFIXES = ("gpuwatch_", "DCGM_", "nvidia_smi_")
_HISTORY_S = 4 * 3600.0
"""How long the stand-in's Prometheus has scraped its targets, as its history tells."""


# ---------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class Page:
    """One page's text and its series by name: (labels, value)."""

    text: str
    series: dict[str, list[tuple[dict[str, str], float]]]

    @classmethod
    def of(cls, text: str) -> Page:
        series: dict[str, list[tuple[dict[str, str], float]]] = {}
        for sample in parse_exposition(text, _PREFIXES):
            series.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return cls(text, series)


@dataclass
class Target:
    job: str
    instance: str
    page: Page | None
    """`None`: never up (nothing listens)."""
    renames: dict[str, str]
    """Label values of the page's template and this node's own (host name, uuids)."""
    phase_s: float

    def labels(self, labels: dict[str, str]) -> dict[str, str]:
        """A series' labels as stored: this node's values, the target's `job` and
        `instance` (an exporter's own renamed `exported_*`), empty ones dropped."""
        renames = self.renames
        out = {
            ("exported_" + k if k in ("job", "instance") else k): renames.get(v, v)
            for k, v in labels.items()
            if v
        }
        out["job"], out["instance"] = self.job, self.instance
        return out

    def text(self, scraped_at: float) -> str:
        """The page as this node serves it."""
        assert self.page is not None
        text = self.page.text
        for old, new in self.renames.items():
            text = text.replace(f'="{old}"', f'="{new}"')
        stamp = re.compile(rf"^({STAMP}(?:{{[^}}]*}})?) \S+$", re.MULTILINE)
        return stamp.sub(lambda m: f"{m[1]} {scraped_at - 0.5!r}", text)


def mixed_fleet(count: int, seed: int = 1) -> list[Target]:
    """`count` targets: 89 % gpuwatch daemons, 8 % dcgm-exporter, 2 % nvidia_gpu_exporter,
    1 % down (at least one of each from 20 targets)."""
    down = max(1, count // 100) if count >= 20 else 0
    smi = max(1, count * 2 // 100) if count >= 20 else 0
    dcgm = max(1, count * 8 // 100) if count >= 20 else 0
    daemons = count - down - smi - dcgm
    rng = random.Random(seed)
    templates = [_daemon_template(rng, n) for n in range(TEMPLATES)]
    dcgm_pages = [Page.of((RECORDED / name).read_text()) for name in DCGM_PAGES]
    smi_pages = [Page.of((RECORDED / name).read_text()) for name in SMI_PAGES]
    targets = []
    for n in range(1, daemons + 1):
        page, old = templates[n % TEMPLATES]
        name = f"gpu-{n:05d}"
        renames = {old[0]: name, **{u: _uuid(n, i) for i, u in enumerate(old[1:])}}
        targets.append(Target("gpuwatch", f"{name}:9400", page, renames, rng.random()))
    for n in range(1, dcgm + 1):
        page = dcgm_pages[n % len(dcgm_pages)]
        name = f"dcgm-{n:05d}"
        targets.append(Target("dcgm", f"{name}:9400", page, _hosts(page, name), rng.random()))
    for n in range(1, smi + 1):
        page = smi_pages[n % len(smi_pages)]
        name = f"smi-{n:05d}"
        targets.append(Target("smi", f"{name}:9835", page, _hosts(page, name), rng.random()))
    for n in range(1, down + 1):
        targets.append(Target("gpuwatch", f"down-{n:05d}:9400", None, {}, rng.random()))
    return targets


def _daemon_template(rng: random.Random, number: int) -> tuple[Page, list[str]]:
    """A daemon's page, and the label values that make it one node's: its host name and
    its GPUs' uuids."""
    name = f"template-{number:02d}"
    node = Node(name, number, draw_node(rng, GPUS), jobs=number % 3 == 0)
    text = node.body(time.time()).decode()
    page = Page.of(text)
    uuids = sorted({labels["uuid"] for labels, _ in page.series["gpuwatch_gpu_info"]})
    return page, [name, *uuids]


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * 8 + gpu:012x}"


def _hosts(page: Page, name: str) -> dict[str, str]:
    """The page's host labels' values made `name` (a dcgm-exporter pod's own name kept)."""
    hosts = {
        labels[key]
        for series in page.series.values()
        for labels, _ in series
        for key in ("Hostname", "hostname")
        if key in labels and "dcgm-exporter-" not in labels[key]
    }
    return dict.fromkeys(hosts, name)


# ---------------------------------------------------------------- PromQL: parsing


class PromQLError(ValueError):
    pass


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],])
    |(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
    )""",
    re.VERBOSE,
)
_DURATION = re.compile(r"\s*([0-9]+)(ms|s|m|h|d|w|y)")
_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_AGGREGATIONS = frozenset({"max", "min", "sum", "count", "group", "avg"})
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    ">": 3,
    "<=": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}
_COMPARISONS = frozenset({"==", "!=", "<", ">", "<=", ">="})
_SET_OPS = frozenset({"and", "or", "unless"})


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class String:
    value: str


@dataclass(frozen=True)
class Selector:
    matchers: tuple[tuple[str, str, str], ...]
    range_s: float | None = None
    offset_s: float = 0.0


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Aggregation:
    op: str
    by: tuple[str, ...]
    expr: Expr


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Expr
    rhs: Expr
    on: tuple[str, ...] | None = None
    ignoring: tuple[str, ...] = ()
    returns_bool: bool = False


Expr = Number | String | Selector | Call | Aggregation | Binary


class Parser:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def parse(self) -> Expr:
        expr = self.expression(0)
        if self.text[self.at :].strip():
            raise PromQLError(f"unexpected {self.text[self.at : self.at + 20]!r}")
        return expr

    def peek(self) -> tuple[str, str]:
        found = _TOKEN.match(self.text, self.at)
        if found is None or found.end() == self.at or not found.lastgroup:
            if self.text[self.at :].strip():
                raise PromQLError(f"cannot read {self.text[self.at : self.at + 20]!r}")
            return ("end", "")
        return (found.lastgroup, found[found.lastgroup])

    def take(self, expected: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if expected is not None and token[1] != expected:
            raise PromQLError(f"expected {expected!r}, found {token[1]!r}")
        found = _TOKEN.match(self.text, self.at)
        assert found is not None
        self.at = found.end()
        return token

    def expression(self, floor: int) -> Expr:
        lhs = self.unary()
        while True:
            kind, op = self.peek()
            precedence = _PRECEDENCE.get(op, 0) if kind in ("op", "name") else 0
            if precedence <= floor:
                return lhs
            self.take()
            binary = self.modifiers(op)
            # `^` is right-associative; the others left.
            rhs = self.expression(precedence - 1 if op == "^" else precedence)
            lhs = Binary(op, lhs, rhs, binary[0], binary[1], binary[2])

    def modifiers(self, op: str) -> tuple[tuple[str, ...] | None, tuple[str, ...], bool]:
        returns_bool = False
        if self.peek() == ("name", "bool"):
            self.take()
            returns_bool = True
        on, ignoring = None, ()
        if self.peek() == ("name", "on"):
            self.take()
            on = self.labels()
        elif self.peek() == ("name", "ignoring"):
            self.take()
            ignoring = self.labels()
        if self.peek()[1] in ("group_left", "group_right"):
            raise PromQLError(f"{self.peek()[1]} is not answered here")
        return on, ignoring, returns_bool

    def labels(self) -> tuple[str, ...]:
        self.take("(")
        names = []
        while self.peek()[1] != ")":
            names.append(self.take()[1])
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return tuple(names)

    def unary(self) -> Expr:
        if self.peek()[1] == "-":
            self.take()
            return Binary("*", Number(-1), self.unary())
        return self.postfix(self.primary())

    def primary(self) -> Expr:  # noqa: PLR0911 - one return per kind of term
        kind, value = self.take()
        if kind == "number":
            return Number(float(value))
        if kind == "string":
            return String(_unquote(value))
        if value == "(":
            inner = self.expression(0)
            self.take(")")
            return inner
        if value == "{":
            return Selector(self.matchers())
        if kind != "name":
            raise PromQLError(f"unexpected {value!r}")
        if value in _AGGREGATIONS and self.peek()[1] in ("by", "("):
            by: tuple[str, ...] = ()
            if self.peek()[1] == "by":
                self.take()
                by = self.labels()
            self.take("(")
            expr = self.expression(0)
            self.take(")")
            if self.peek() == ("name", "by"):
                self.take()
                by = self.labels()
            return Aggregation(value, by, expr)
        if self.peek()[1] == "(":
            self.take()
            args = []
            while self.peek()[1] != ")":
                args.append(self.expression(0))
                if self.peek()[1] == ",":
                    self.take()
            self.take(")")
            return Call(value, tuple(args))
        matchers = (("__name__", "=", value),)
        if self.peek()[1] == "{":
            self.take()
            matchers += self.matchers()
        return Selector(matchers)

    def matchers(self) -> tuple[tuple[str, str, str], ...]:
        found = []
        while self.peek()[1] != "}":
            label = self.take()[1]
            op = self.take()[1]
            if op not in ("=", "!=", "=~", "!~"):
                raise PromQLError(f"bad matcher {op!r}")
            kind, value = self.take()
            if kind != "string":
                raise PromQLError("a matcher's value is a string")
            found.append((label, op, _unquote(value)))
            if self.peek()[1] == ",":
                self.take()
        self.take("}")
        return tuple(found)

    def postfix(self, expr: Expr) -> Expr:
        if self.peek()[1] == "[" and isinstance(expr, Selector):
            self.take()
            expr = Selector(expr.matchers, self.duration())
            self.take("]")
        if self.peek() == ("name", "offset") and isinstance(expr, Selector):
            self.take()
            expr = Selector(expr.matchers, expr.range_s, self.duration())
        return expr

    def duration(self) -> float:
        found = _DURATION.match(self.text, self.at)
        if found is None:
            raise PromQLError("expected a duration")
        total = 0.0
        while found is not None:
            total += int(found[1]) * _UNITS_S[found[2]]
            self.at = found.end()
            found = _DURATION.match(self.text, self.at)
            if found is not None and found.start() != self.at:
                break
        return total


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), body)


# ---------------------------------------------------------------- PromQL: evaluation

Element = tuple[dict[str, str], float, float]
"""A vector's element: labels (with `__name__` where kept), value, sample time."""
Value = list[Element] | float | str


@dataclass
class Prometheus:
    """The targets' series as a Prometheus scraping them every `interval_s` holds them."""

    targets: list[Target]
    interval_s: float
    started_at: float = field(default_factory=time.time)
    _regexes: dict[str, Callable[[str], bool]] = field(default_factory=dict)
    _index: dict[str, list[tuple[int, dict[str, str], float | None]]] = field(default_factory=dict)
    answers: dict[str, bytes] = field(default_factory=dict)
    """The answers to queries that read no time, as JSON, their evaluation time `_AT`."""
    names: set[str] = field(init=False)
    """Every series name any target has."""

    def __post_init__(self) -> None:
        self.names = {"up", "scrape_duration_seconds"}.union(
            *(t.page.series for t in self.targets if t.page is not None)
        )

    def scraped_at(self, target: Target, at: float) -> float:
        """The start of the target's last scrape at or before `at`."""
        phase = self.started_at - _HISTORY_S + target.phase_s * self.interval_s
        return phase + math.floor((at - phase) / self.interval_s) * self.interval_s

    def query(self, text: str, at: float) -> tuple[Value, bool]:
        """`text` evaluated at `at`, and whether the answer is the same at every time:
        the pages do not change, so that a query that reads no time (a scrape's, a
        snapshot's) is answered alike at every read."""
        expr = Parser(text).parse()
        return self.evaluate(expr, at, None), not self._timed(expr)

    def _timed(self, expr: Expr) -> bool:
        """Whether `expr` reads a time: `timestamp()`, or a series whose value is one."""
        if isinstance(expr, Selector):
            by_name = [m for m in expr.matchers if m[0] == "__name__"]
            timed = ("up", "scrape_duration_seconds", STAMP)
            return any(all(self._matches(m, name) for m in by_name) for name in timed)
        if isinstance(expr, Call):
            return expr.name == "timestamp" or any(self._timed(a) for a in expr.args)
        if isinstance(expr, Aggregation):
            return self._timed(expr.expr)
        if isinstance(expr, Binary):
            return self._timed(expr.lhs) or self._timed(expr.rhs)
        return False

    def evaluate(self, expr: Expr, at: float, only: set[tuple[str, str]] | None) -> Value:
        """`only`: the (job, instance) whose series may be read (an `and on (job, instance)`
        around it keeps no other)."""
        if isinstance(expr, Number):
            return expr.value
        if isinstance(expr, String):
            return expr.value
        if isinstance(expr, Selector):
            return self.select(expr, at, only)
        if isinstance(expr, Call):
            return self.call(expr, at, only)
        if isinstance(expr, Aggregation):
            return _aggregate(expr, _vector(self.evaluate(expr.expr, at, only)))
        return self.binary(expr, at, only)

    def select(self, selector: Selector, at: float, only: set[tuple[str, str]] | None) -> Value:
        at -= selector.offset_s
        by_name = [m for m in selector.matchers if m[0] == "__name__"]
        names = [n for n in sorted(self.names) if all(self._matches(m, n) for m in by_name)]
        by_target = [m for m in selector.matchers if m[0] in ("job", "instance")]
        rest = [m for m in selector.matchers if m[0] not in ("__name__", "job", "instance")]
        allowed = None
        if only is not None or by_target:
            allowed = {
                number
                for number, target in enumerate(self.targets)
                if (only is None or (target.job, target.instance) in only)
                and all(self._matches(m, getattr(target, m[0])) for m in by_target)
            }
        found: list[Element] = []
        append = found.append
        scraped_at = self._scraped_at(at)
        for name in names:
            for number, labels, value in self._stored(name):
                if allowed is not None and number not in allowed:
                    continue
                if rest and not all(self._matches(m, labels.get(m[0], "")) for m in rest):
                    continue
                scraped = scraped_at[number]
                append((labels, scraped - 0.5 if value is None else value, scraped))
        return found

    def _scraped_at(self, at: float) -> list[float]:
        """Each target's last scrape at `at`."""
        return [self.scraped_at(target, at) for target in self.targets]

    def _stored(self, name: str) -> list[tuple[int, dict[str, str], float | None]]:
        """Every target's series of `name` as stored: (target, labels, value, `None` for
        a daemon's snapshot time), built at the first query that reads them."""
        found = self._index.get(name)
        if found is not None:
            return found
        found = []
        for number, target in enumerate(self.targets):
            if name == "up":
                found.append((number, target.labels({}), 1.0 if target.page else 0.0))
            elif name == "scrape_duration_seconds":
                found.append((number, target.labels({}), 0.01))
            elif target.page is not None:
                found += [
                    (number, target.labels(labels), None if name == STAMP else value)
                    for labels, value in target.page.series.get(name, ())
                ]
        for _, labels, _ in found:
            labels["__name__"] = name
        self._index[name] = found
        return found

    def _matches(self, matcher: tuple[str, str, str], value: str) -> bool:
        _, op, wanted = matcher
        if op == "=":
            return value == wanted
        if op == "!=":
            return value != wanted
        pattern = self._regexes.get(wanted)
        if pattern is None:
            pattern = self._regexes[wanted] = _pattern(wanted)
        hit = pattern(value)
        return hit if op == "=~" else not hit

    def call(self, call: Call, at: float, only: set[tuple[str, str]] | None) -> Value:
        args = [self.evaluate(arg, at, only) for arg in call.args]
        if call.name == "timestamp":
            return [(_drop_name(labels), ts, ts) for labels, _, ts in _vector(args[0])]
        if call.name.endswith("_over_time"):  # the history is the present's (see above)
            keep = call.name == "last_over_time"
            return [(lb if keep else _drop_name(lb), v, ts) for lb, v, ts in _vector(args[0])]
        if call.name == "label_replace":
            vector, dst, replacement, src, regex = args
            assert isinstance(dst, str) and isinstance(replacement, str)
            assert isinstance(src, str) and isinstance(regex, str)
            return [
                (_label_replace(labels, dst, replacement, src, regex), v, ts)
                for labels, v, ts in _vector(vector)
            ]
        if call.name == "vector" and isinstance(args[0], float):
            return [({}, args[0], at)]
        raise PromQLError(f"function {call.name} is not answered here")

    def binary(self, expr: Binary, at: float, only: set[tuple[str, str]] | None) -> Value:
        if expr.op == "and" and expr.on is not None and {"job", "instance"} <= set(expr.on):
            # Read the left side only where the right side has series: as Prometheus's
            # answer, without reading every target's.
            rhs = _vector(self.evaluate(expr.rhs, at, only))
            targets = {(labels["job"], labels["instance"]) for labels, _, _ in rhs}
            lhs = self.evaluate(expr.lhs, at, targets if only is None else only & targets)
        else:
            lhs = self.evaluate(expr.lhs, at, only)
            rhs = self.evaluate(expr.rhs, at, only)
        return _binary(expr, lhs, rhs)


_LITERAL = re.compile(r"(?:[^\\.+*?()|\[\]{}^$]|\\.)*")


def _pattern(regex: str) -> Callable[[str], bool]:
    """Whether a value matches `regex` whole; a list of literals (`a\\.b|c`, as
    `gpuwatch.fleet.promql.instances` writes one) as a set, in one step."""
    literals = re.split(r"(?<!\\)\|", regex)
    if all(_LITERAL.fullmatch(part) for part in literals):
        return {re.sub(r"\\(.)", r"\1", part) for part in literals}.__contains__
    compiled = re.compile(regex)
    return lambda value: compiled.fullmatch(value) is not None


def _vector(value: Value) -> list[Element]:
    if not isinstance(value, list):
        raise PromQLError("expected an instant vector")
    return value


def _drop_name(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


def _label_replace(
    labels: dict[str, str], dst: str, replacement: str, src: str, regex: str
) -> dict[str, str]:
    found = re.fullmatch(regex, labels.get(src, ""))
    if found is None:
        return labels
    value = re.sub(r"\$(\d+)|\$\{(\w+)\}", lambda m: found[m[1] or m[2]] or "", replacement)
    out = {k: v for k, v in labels.items() if k != dst}
    if value:
        out[dst] = value
    return out


def _aggregate(expr: Aggregation, vector: list[Element]) -> list[Element]:
    groups: dict[tuple[str, ...], list[float]] = {}
    times: dict[tuple[str, ...], float] = {}
    by = sorted(expr.by)
    for labels, value, ts in vector:
        key = tuple([labels.get(k, "") for k in by])
        found = groups.get(key)
        if found is None:
            groups[key] = [value]
            times[key] = ts
        else:
            found.append(value)
    combine: dict[str, Callable[[list[float]], float]] = {
        "max": max,
        "min": min,
        "sum": math.fsum,
        "count": len,
        "group": lambda _: 1.0,
        "avg": lambda values: math.fsum(values) / len(values),
    }
    return [
        (
            {k: v for k, v in zip(by, key, strict=True) if v},
            float(combine[expr.op](values)),
            times[key],
        )
        for key, values in groups.items()
    ]


def _signature(labels: dict[str, str], expr: Binary) -> tuple[tuple[str, str], ...]:
    if expr.on is not None:
        return tuple((k, labels.get(k, "")) for k in sorted(expr.on))
    skip = {"__name__", *expr.ignoring}
    return tuple(sorted((k, v) for k, v in labels.items() if k not in skip))


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else math.copysign(math.inf, a) if a else math.nan,
    "%": lambda a, b: math.fmod(a, b) if b else math.nan,
    "^": lambda a, b: a**b,
    "==": lambda a, b: float(a == b),
    "!=": lambda a, b: float(a != b),
    "<": lambda a, b: float(a < b),
    ">": lambda a, b: float(a > b),
    "<=": lambda a, b: float(a <= b),
    ">=": lambda a, b: float(a >= b),
}


def _binary(expr: Binary, lhs: Value, rhs: Value) -> Value:  # noqa: PLR0912 - Prometheus's cases
    if expr.op in _SET_OPS:
        return _set_op(expr, _vector(lhs), _vector(rhs))
    apply = _ARITHMETIC[expr.op]
    comparison = expr.op in _COMPARISONS
    if isinstance(lhs, float) and isinstance(rhs, float):
        return apply(lhs, rhs)
    if isinstance(lhs, float) or isinstance(rhs, float):
        scalar_left = isinstance(lhs, float)
        vector = _vector(rhs if scalar_left else lhs)
        out = []
        for labels, value, ts in vector:
            a, b = (lhs, value) if scalar_left else (value, rhs)
            assert isinstance(a, float) and isinstance(b, float)
            result = apply(a, b)
            if comparison and not expr.returns_bool:
                if result:
                    out.append((labels, value, ts))
            else:
                out.append((_drop_name(labels), result, ts))
        return out
    right = {_signature(labels, expr): (labels, value) for labels, value, _ in _vector(rhs)}
    out = []
    for labels, value, ts in _vector(lhs):
        match = right.get(_signature(labels, expr))
        if match is None:
            continue
        result = apply(value, match[1])
        metric = labels if comparison and not expr.returns_bool else _drop_name(labels)
        if expr.on is not None:
            metric = {k: v for k, v in metric.items() if k in expr.on}
        if comparison and not expr.returns_bool:
            if result:
                out.append((metric, value, ts))
        else:
            out.append((metric, result, ts))
    return out


def _set_op(expr: Binary, lhs: list[Element], rhs: list[Element]) -> list[Element]:
    right = {_signature(labels, expr) for labels, _, _ in rhs}
    if expr.op == "and":
        return [e for e in lhs if _signature(e[0], expr) in right]
    if expr.op == "unless":
        return [e for e in lhs if _signature(e[0], expr) not in right]
    left = {_signature(labels, expr) for labels, _, _ in lhs}
    return lhs + [e for e in rhs if _signature(e[0], expr) not in left]


def format_value(value: float) -> str:
    """As Prometheus writes a sample's value (Go's `FormatFloat(v, 'f', -1, 64)`)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    return f"{value:.17f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------- HTTP


_AT = "@evaluated@"


def answer_query(prometheus: Prometheus, params: dict[str, str]) -> tuple[int, bytes]:
    """The status and JSON of the API's answer. An answer the same at every time is
    built once (the stand-in keeps up with a client as Prometheus would)."""
    at = float(params["time"]) if "time" in params else time.time()
    text = params.get("query", "")
    answer = prometheus.answers.get(text)
    if answer is None:
        try:
            result, timeless = prometheus.query(text, at)
        except (PromQLError, AssertionError, KeyError, re.error) as error:
            refused = {"status": "error", "errorType": "bad_data", "error": str(error)}
            return 400, json.dumps(refused).encode()
        answer = json.dumps({"status": "success", "data": _data(result)}).encode()
        if timeless:
            prometheus.answers[text] = answer
    return 200, answer.replace(f'"{_AT}"'.encode(), f"{at:.3f}".encode())


def _data(result: Value) -> dict[str, object]:
    if isinstance(result, list):
        return {
            "resultType": "vector",
            "result": [
                {"metric": labels, "value": [_AT, format_value(value)]}
                for labels, value, _ in result
            ],
        }
    if isinstance(result, float):
        return {"resultType": "scalar", "result": [_AT, format_value(result)]}
    return {"resultType": "string", "result": [_AT, result]}


def targets_document(prometheus: Prometheus, params: dict[str, str]) -> dict[str, object]:
    pool = params.get("scrapePool")
    now = time.time()
    return {
        "status": "success",
        "data": {
            "activeTargets": [
                {
                    "labels": {"job": t.job, "instance": t.instance},
                    "scrapePool": t.job,
                    "health": "up" if t.page is not None else "down",
                    "lastError": ""
                    if t.page is not None
                    else f'Get "http://{t.instance}/metrics": dial tcp: connect: '
                    "connection refused",
                    "lastScrape": prometheus.scraped_at(t, now),
                }
                for t in prometheus.targets
                if pool is None or t.job == pool
            ],
            "droppedTargets": [],
        },
    }


_NO_RANGE = {"status": "success", "data": {"resultType": "matrix", "result": []}}


class _Server(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def serve(prometheus: Prometheus, port: int) -> _Server:
    pages = {t.instance: t for t in prometheus.targets if t.page is not None}
    one_at_a_time = threading.Lock()  # the evaluator is CPU-bound: threads only queue

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                params |= dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            if url.path.startswith("/pages/"):
                target = pages.get(urllib.parse.unquote(url.path[len("/pages/") :]))
                if target is None:
                    return self._send(404, b"no such page", "text/plain")
                body = target.text(time.time()).encode()
                return self._send(200, body, "text/plain; version=0.0.4")
            if url.path == "/api/v1/query":
                with one_at_a_time:
                    status, body = answer_query(prometheus, params)
            elif url.path == "/api/v1/query_range":
                status, body = 200, json.dumps(_NO_RANGE).encode()
            elif url.path == "/api/v1/targets":
                status, body = 200, json.dumps(targets_document(prometheus, params)).encode()
            else:
                return self._send(404, b"404 page not found", "text/plain")
            self._send(status, body, "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
            if gzipped:
                body = gzip.compress(body, compresslevel=1)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    return _Server(("127.0.0.1", port), Handler)


# ---------------------------------------------------------------- the check


def check(count: int) -> int:
    """Serves `count` targets' pages to a real Prometheus; sends every query gpuwatch sends
    the stand-in to both; prints where their answers differ. 0: they agree."""
    prometheus = Prometheus(mixed_fleet(count), interval_s=1.0)
    server = serve(prometheus, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as home:
        real = RealPrometheus(Path(home), 1.0)
        try:
            _scrape_pages(real, prometheus, server.server_address[1])
            asked = _queries_sent(url, gpuwatch_command())
            differ = 0
            for query in asked:
                if "offset" in query:
                    continue
                ours = _answer_set(url, query)
                theirs = _answer_set(real.url, query)
                print(f"{len(ours):5d} {len(theirs):5d}  {query[:100]}")
                if ours != theirs:
                    differ += 1
                    print(
                        f"differs: {query}\n  stand-in: {sorted(ours)[:3]}\n  real: "
                        f"{sorted(theirs)[:3]}"
                    )
            print(f"{len(asked)} queries, {differ} answered otherwise")
            return 1 if differ else 0
        finally:
            real.stop()
            server.shutdown()


def _scrape_pages(real: RealPrometheus, standin: Prometheus, port: int) -> None:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{port if t.page else 9}"],
                        "labels": {
                            "instance": t.instance,
                            "__metrics_path__": f"/pages/{t.instance}",
                        },
                    }
                    for t in standin.targets
                    if t.job == job
                ],
            }
            for job in sorted({t.job for t in standin.targets})
        ],
    }
    (real.home / "prometheus.yml").write_text(json.dumps(config))
    urllib.request.urlopen(
        urllib.request.Request(f"{real.url}/-/reload", method="POST"), timeout=60
    ).close()
    up = sum(1 for t in standin.targets if t.page is not None)
    real.wait_for("count(up == 1)", lambda found: bool(found) and found[0][1] >= up, "scrapes")
    real.wait_for("count(up == 0)", bool, "the down targets")
    time.sleep(3)


def _queries_sent(url: str, gpuwatch: str) -> list[str]:
    """Every query `where -n 2`, `fleet --json` and `fleet --once` send, through a proxy
    that records them."""
    asked: list[str] = []
    lock = threading.Lock()
    upstream = urllib.parse.urlsplit(url)

    class Recorder(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
            params |= dict(urllib.parse.parse_qsl(body.decode()))
            if "query" in params and "query_range" not in self.path:
                with lock:
                    asked.append(params["query"])
            connection = http.client.HTTPConnection(upstream.netloc, timeout=120)
            connection.request(
                self.command,
                self.path,
                body=body or None,
                headers={"Content-Type": self.headers.get("Content-Type", "")},
            )
            answer = connection.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.getheader("Content-Type") or "")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _relay

        def log_message(self, format: str, *args: object) -> None:
            pass

    proxy = _Server(("127.0.0.1", 0), Recorder)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    through = f"http://127.0.0.1:{proxy.server_address[1]}"
    for argv in (
        ["where", "-n", "2"],
        ["fleet", "--json"],
        ["fleet", "--once"],
        ["where", "-n", "1", "--max-util", "50"],
    ):
        subprocess.run([gpuwatch, *argv, "--prometheus", through], capture_output=True, check=False)
    proxy.shutdown()
    return list(dict.fromkeys(asked))


def _answer_set(url: str, query: str) -> set[tuple[tuple[tuple[str, str], ...], str]]:
    """An answer's series, each its labels and value; values that are times (a scrape's,
    a snapshot's) as "time"."""
    form = urllib.parse.urlencode({"query": query, "time": f"{time.time() - 1:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query", form.encode(), timeout=60) as answer:
        document = json.load(answer)
    if document["status"] != "success":
        return {((("error", document.get("error", "")),), "")}
    found = set()
    for item in document["data"]["result"]:
        value = item["value"][1]
        shown = "time" if abs(float(value)) > 1e9 else value
        found.add((tuple(sorted(item["metric"].items())), shown))
    return found


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--check", type=int, metavar="N", help="check N nodes against Prometheus")
    args = parser.parse_args()
    if args.check:
        return check(args.check)
    prometheus = Prometheus(mixed_fleet(args.nodes), args.scrape_interval)
    server = serve(prometheus, args.port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"url": f"http://127.0.0.1:{server.server_address[1]}"}), flush=True)
    for _ in iter(sys.stdin.readline, ""):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
