"""One round of instant queries to Prometheus, sent at once: what each asks (`Asked`), and
what the answers say, target by target (`Found`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import msgspec

from gpuwatch.fleet import promql, summaries
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.fetch import Budget
from gpuwatch.fleet.promapi import PromClient
from gpuwatch.fleet.promql import Query

Target = tuple[str, str]
"""(job, instance): one scraped endpoint."""
UP, NAMES, PROBE = "up", "names", "probe"
"""The queries that are not families': targets, their names, the rules' probe."""
MAIN, HELD, DETAIL, SLOW = "main", "held", "detail", "slow"
"""Whose answer a query's is: the round's series, the series the table holds between
refreshes (each daemon's figures, the other exporters' GPUs: asked of the targets scraped
since), the series of some targets GPU by GPU beside those, what changes slowly."""


class Asked(msgspec.Struct, frozen=True):
    """One query of a round: what it asks, whose answer it is, the matcher that narrows
    it to some targets ("" for all), and, where `since` is given, only the targets
    scraped since that time (Prometheus's evaluation time of an earlier read)."""

    query: Query | str
    role: str = MAIN
    matcher: str = ""
    since: float | None = None

    @property
    def family(self) -> str:
        return "" if isinstance(self.query, str) else self.query.family

    def promql(self) -> str:
        if self.query == NAMES:
            return promql.names()
        if self.query == PROBE:
            return summaries.PROBE
        if self.query == UP:
            text = promql.UP_SEEN
        else:
            assert not isinstance(self.query, str)
            text = self.query.promql(self.matcher)
        return text if self.since is None else promql.scraped_since(text, self.since)


class Found(msgspec.Struct):
    """What a read's answers say, by target."""

    evaluated: float = 0.0
    """Prometheus's evaluation time of the round."""
    seen: dict[Target, float] = msgspec.field(default_factory=dict)
    """Each target's last scrape time, negative where it failed."""
    scraped_as: dict[Target, dict[str, str]] = msgspec.field(default_factory=dict)
    """The labels Prometheus gives every series of each target (its `up`'s)."""
    names: dict[Target, str] | None = None
    """Each target's host label of the last hour; `None`: not asked this round."""
    exporters: dict[Target, str] = msgspec.field(default_factory=dict)
    last: dict[Target, float] = msgspec.field(default_factory=dict)
    """A gpuwatch daemon's last snapshot time, within the names query's hour."""
    samples: dict[Target, list[Sample]] = msgspec.field(default_factory=lambda: defaultdict(list))
    held: dict[Target, list[Sample]] = msgspec.field(default_factory=lambda: defaultdict(list))
    details: dict[Target, list[Sample]] = msgspec.field(default_factory=lambda: defaultdict(list))
    slow: dict[Target, list[Sample]] = msgspec.field(default_factory=lambda: defaultdict(list))
    rules: bool | None = None
    """Whether the server records the fleet rules; `None`: not probed this round."""
    fresh: set[Target] | None = None
    """Where a round read only the targets scraped since the last (the table's, once its
    memory filed the answers: `TableMemory.keep`), the targets that may have changed: any
    answer told of them, or their series of what changes slowly were read anew. Every
    other target's series and values are as held, the very ones of the round before.
    `None`: any target may have changed."""


def ask(
    client: PromClient, asked: Sequence[Asked], at: float, budget: Budget, found: Found
) -> None:
    """Sends `asked` at once, each evaluated at `at`, within what is left of `budget`, and
    files the answers into `found`."""
    texts = [item.promql() for item in asked]
    answers = client.samples(texts, [item.family for item in asked], at=at, budget=budget)
    for item, (evaluated, vector) in zip(asked, answers, strict=True):
        found.evaluated = max(found.evaluated, evaluated)
        if item.query == UP:
            for sample in vector:
                target = target_of(sample.labels)
                found.seen[target] = sample.value
                found.scraped_as[target] = sample.labels
        elif item.query == NAMES:
            _file_names(vector, found)
        elif item.query == PROBE:
            found.rules = bool(vector)
        else:
            filed = {
                MAIN: found.samples,
                HELD: found.held,
                DETAIL: found.details,
                SLOW: found.slow,
            }[item.role]
            for sample in vector:
                filed[target_of(sample.labels)].append(sample)
    # Where no answer holds a sample (each narrowed to targets none of which was scraped
    # since), the round was evaluated at `at` all the same.
    found.evaluated = found.evaluated or at


def target_of(labels: dict[str, str]) -> Target:
    return (labels.get("job", ""), labels.get("instance", ""))


def _file_names(vector: list[Sample], found: Found) -> None:
    names: dict[Target, str] = {}
    for sample in vector:
        target = target_of(sample.labels)
        found.exporters.setdefault(target, sample.labels.get("exporter", ""))
        if sample.value > 0:
            found.last[target] = max(found.last.get(target, 0.0), sample.value)
        name = sample.labels.get("hostname") or sample.labels.get("Hostname")
        if name:
            names.setdefault(target, name)
    found.names = names
