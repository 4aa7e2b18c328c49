"""How the fleet table is seen: sort, filter, selection, the status line.

Pure, as `gpuwatch.tui.node.model` is for the node screen: `FleetView` is a frozen value,
each thing a user can do returns the next one, and `arrange` turns the rows into the
rows shown: a filter pass and one sort, so 1,000 nodes cost n log n, never n².
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import ClassVar, Self

import msgspec
from msgspec.structs import replace

from gpuwatch.tui.common.view import TableChoices
from gpuwatch.tui.fleet.cells import BY_KEY
from gpuwatch.tui.fleet.rows import NodeRow

DEFAULT_SORT = "free"
"""At start, nodes with the most free GPUs first (then the most free memory on one)."""


class NodeFilter(msgspec.Struct, frozen=True):
    """`user:alice free down WORD`: every term must match.

    `user:NAME` keeps nodes where NAME runs a process or a job, and those whose users are
    not known yet (warming up: hiding them could hide NAME's), `free` nodes with a free
    GPU, `down` nodes that are down or stale, `idle` nodes with an idle holder; any other
    word must appear in the node's name, exporter or GPU models.
    """

    users: frozenset[str] = frozenset()
    free_only: bool = False
    down_only: bool = False
    idle_only: bool = False
    words: tuple[str, ...] = ()
    problem: str = ""

    @classmethod
    def parse(cls, text: str) -> NodeFilter:
        users: set[str] = set()
        words: list[str] = []
        bad: list[str] = []
        flags = {"free": False, "down": False, "idle": False}
        for term in text.split():
            name, colon, value = term.partition(":")
            if colon and name == "user" and value:
                users.add(value)
            elif colon:
                bad.append(term)
            elif term in flags:
                flags[term] = True
            else:
                words.append(term.lower())
        problem = f"not understood: {' '.join(bad)}" if bad else ""
        return cls(
            frozenset(users), flags["free"], flags["down"], flags["idle"], tuple(words), problem
        )

    def __bool__(self) -> bool:
        return bool(self.users or self.free_only or self.down_only or self.idle_only or self.words)

    def matches(self, row: NodeRow) -> bool:
        if self.users and row.users is not None and not self.users & row.users:
            return False
        if self.free_only and not row.gpus_free:
            return False
        if self.down_only and row.up:
            return False
        if self.idle_only and not row.idle_held:
            return False
        haystack = f"{row.node} {row.exporter or ''} {row.models}".lower()
        return all(word in haystack for word in self.words)


class FleetView(TableChoices, msgspec.Struct, frozen=True):
    """Everything the user chose about the fleet table; never the rows themselves."""

    DEFAULT_SORT: ClassVar[str] = DEFAULT_SORT
    NEW_COLUMN_DESCENDS: ClassVar[bool] = True
    ASCENDING: ClassVar[frozenset[str]] = frozenset({"node"})

    sort_column: str = DEFAULT_SORT
    node_filter: NodeFilter = msgspec.field(default_factory=NodeFilter)

    def filter(self, text: str) -> Self:
        return replace(self, filter_text=text, node_filter=NodeFilter.parse(text))

    def clear(self) -> Self:
        """Esc: no filter; the order stays."""
        return replace(self, filter_text="", node_filter=NodeFilter())

    def arrange(self, rows: Iterable[NodeRow]) -> list[NodeRow]:
        """`rows` filtered and sorted; ties by node name, so the order is stable."""
        node_filter = self.node_filter
        shown = [row for row in rows if node_filter.matches(row)] if node_filter else list(rows)
        shown.sort(key=attrgetter("node"))
        if self.sort_column == "node":
            return shown[::-1] if self.sort_reverse else shown
        value = BY_KEY[self.sort_column].sort_value
        return sorted(shown, key=value, reverse=self.sort_reverse)  # type: ignore[arg-type]

    def status(self, shown: int, total: int) -> str:
        """The status line: order, filter and its problems, how many nodes are shown."""
        parts = [self.sort_status(BY_KEY[self.sort_column].title)]
        if self.node_filter:
            parts.append(f"filter: {self.filter_text}  ({shown} of {total} nodes)")
        if self.node_filter.problem:
            parts.append(self.node_filter.problem)
        return "  ·  ".join(parts)
