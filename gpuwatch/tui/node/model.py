"""How the process table is seen: sort, filter, tags, tree view, selection, status line.

Pure, and without Textual: `TableView` is a frozen value, each thing a user can do is a
method that returns the next one, and `arrange` turns the screen's rows into the rows
shown. The app maps keys to these transitions and draws what comes out, so every rule of
the table (a tag outlives no row, a sort column that left the screen falls back until it
is back, a header clicked twice reverses) is tested here without a terminal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar, Self

import msgspec
from msgspec.structs import replace

from gpuwatch.tui.common.frames import Ancestor
from gpuwatch.tui.common.view import TableChoices
from gpuwatch.tui.node.rows import BY_KEY, Row, RowFilter, sort_rows
from gpuwatch.tui.node.tree import tree_order

DEFAULT_SORT = "gpu_mem"
"""The column sorted by at start, and when the one chosen is no longer shown."""


class TableView(TableChoices, msgspec.Struct, frozen=True):
    """Everything the user chose about the process table; never the rows themselves."""

    DEFAULT_SORT: ClassVar[str] = DEFAULT_SORT
    NOT_AN_ORDER: ClassVar[frozenset[str]] = frozenset({"host"})

    sort_column: str = DEFAULT_SORT
    row_filter: RowFilter = msgspec.field(default_factory=RowFilter)
    tagged: frozenset[str] = frozenset()
    tree: bool = False
    message: str = ""
    """What the last action said (signals sent, nothing selected), until cleared."""

    # --- filter, tags, tree, selection --------------------------------------------------------

    def filter(self, text: str) -> Self:
        return replace(self, filter_text=text, row_filter=RowFilter.parse(text))

    def clear(self) -> Self:
        """Esc: no filter, no tags, no message; sort and tree view stay."""
        return replace(self, filter_text="", row_filter=RowFilter(), tagged=frozenset(), message="")

    def toggle_tag(self, key: str) -> TableView:
        return replace(self, tagged=self.tagged ^ {key})

    def untag_all(self) -> TableView:
        return replace(self, tagged=frozenset())

    def keep_tags(self, shown: Iterable[str]) -> TableView:
        """Tags only on rows still shown: a process that exits (or is filtered out) loses its
        tag, so a signal never reaches a pid that has come to name another process."""
        if not self.tagged:
            return self
        kept = self.tagged.intersection(shown)
        return self if kept == self.tagged else replace(self, tagged=kept)

    def toggle_tree(self) -> TableView:
        return replace(self, tree=not self.tree)

    def say(self, text: str) -> TableView:
        return replace(self, message=text)

    # --- what is shown ------------------------------------------------------------------------

    def arrange(
        self,
        rows: Iterable[Row],
        ancestors: Sequence[tuple[str, Mapping[int, Ancestor]]] = (),
    ) -> list[Row]:
        """`rows` filtered and sorted; in the tree view, each source's rows (those whose
        `ancestors` are known) under their parents."""
        shown = [row for row in rows if self.row_filter.matches(row)]
        shown = sort_rows(shown, self.sort_column, reverse=self.sort_reverse)
        if self.tree:
            for source, known in ancestors:
                shown = tree_order(shown, known, source)
        return shown

    def targets(self, rows_by_key: Mapping[str, Row], selected: Row | None) -> list[Row]:
        """The rows a signal goes to: the tagged ones, or else the one under the cursor."""
        chosen = [row for key in self.tagged if (row := rows_by_key.get(key)) is not None]
        if not chosen and selected is not None:
            chosen = [selected]
        return chosen

    def status(self) -> str:
        """The status line: order, tree view, filter and its problems, tags, the message."""
        parts = [self.sort_status(BY_KEY[self.sort_column].title)]
        if self.tree:
            parts.append("tree view")
        if self.row_filter:
            parts.append(f"filter: {self.filter_text}")
        if self.row_filter.problem:
            parts.append(self.row_filter.problem)
        if self.tagged:
            parts.append(f"{len(self.tagged)} tagged")
        if self.message:
            parts.append(self.message)
        return "  ·  ".join(parts)
