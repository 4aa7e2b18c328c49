"""How the fleet table is seen: sort, filter, selection, the users view, the status line.

Pure, as `gpuwatch.tui.node.model` is for the node screen: `FleetView` is a frozen value,
each thing a user can do returns the next one, and `arrange` turns the rows into the
rows shown: a filter pass and one sort, so 1,000 nodes cost n log n, never n².
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpuwatch.tui.fleet.cells import BY_KEY
from gpuwatch.tui.fleet.rows import NodeRow

DEFAULT_SORT = "free"
"""At start, nodes with the most free GPUs first (then the most free memory on one)."""


@dataclass(frozen=True, slots=True)
class NodeFilter:
    """`user:alice free down WORD`: every term must match.

    `user:NAME` keeps nodes where NAME runs a process or a job, `free` nodes with a free GPU,
    `down` nodes that are down or stale, `idle` nodes with an idle holder; any other
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
        if self.users and not self.users & row.users:
            return False
        if self.free_only and not row.gpus_free:
            return False
        if self.down_only and row.up:
            return False
        if self.idle_only and not row.idle_held:
            return False
        haystack = f"{row.node} {row.exporter or ''} {row.models}".lower()
        return all(word in haystack for word in self.words)


@dataclass(frozen=True, slots=True)
class FleetView:
    """Everything the user chose about the fleet table; never the rows themselves."""

    sort_column: str = DEFAULT_SORT
    sort_reverse: bool = True
    filter_text: str = ""
    node_filter: NodeFilter = field(default_factory=NodeFilter)
    selected: str | None = None
    """The node under the cursor, once the user moved it."""
    users: bool = False
    """The users view instead of the nodes."""

    def sort_by(self, column: str) -> FleetView:
        """A header clicked: that column, or the other direction when it already sorts."""
        if column == self.sort_column:
            return replace(self, sort_reverse=not self.sort_reverse)
        return replace(self, sort_column=column, sort_reverse=column != "node")

    def cycle_sort(self, shown: Sequence[str], step: int) -> FleetView:
        """The next (`step` 1) or previous (-1) of the `shown` columns."""
        keys = list(shown) or [DEFAULT_SORT]
        position = keys.index(self.sort_column) if self.sort_column in keys else 0
        return self.sort_by(keys[(position + step) % len(keys)])

    def reverse(self) -> FleetView:
        return replace(self, sort_reverse=not self.sort_reverse)

    def fit_columns(self, shown: Iterable[str]) -> FleetView:
        """Back to the default sort when the sort column is no longer shown."""
        if self.sort_column in set(shown):
            return self
        return replace(self, sort_column=DEFAULT_SORT, sort_reverse=True)

    def filter(self, text: str) -> FleetView:
        return replace(self, filter_text=text, node_filter=NodeFilter.parse(text))

    def clear(self) -> FleetView:
        """Esc: no filter; sort and view stay."""
        return replace(self, filter_text="", node_filter=NodeFilter())

    def select(self, key: str | None) -> FleetView:
        return self if key == self.selected else replace(self, selected=key)

    def toggle_users(self) -> FleetView:
        return replace(self, users=not self.users)

    def arrange(self, rows: Iterable[NodeRow]) -> list[NodeRow]:
        """`rows` filtered and sorted; ties by node name, so the order is stable."""
        shown = [row for row in rows if self.node_filter.matches(row)]
        shown.sort(key=lambda row: row.node)
        if self.sort_column == "node":
            return shown[::-1] if self.sort_reverse else shown
        value = BY_KEY[self.sort_column].sort_value
        return sorted(shown, key=value, reverse=self.sort_reverse)  # type: ignore[arg-type]

    def status(self, shown: int, total: int) -> str:
        """The status line: order, filter and its problems, how many nodes are shown."""
        title = BY_KEY[self.sort_column].title
        parts = [f"sorted by {title} {'▼' if self.sort_reverse else '▲'}"]
        if self.node_filter:
            parts.append(f"filter: {self.filter_text}  ({shown} of {total} nodes)")
        if self.node_filter.problem:
            parts.append(self.node_filter.problem)
        return "  ·  ".join(parts)
