"""What a user chose about a table, shared by both tables: its order and the row chosen.

Pure, and without Textual: `TableChoices` is a frozen value and each thing a user can do is
a method that returns the next one. Each table's own view (`node.model.TableView`,
`fleet.model.FleetView`) adds its filter and says its default order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar, Self

import msgspec
from msgspec.structs import replace


class TableChoices(msgspec.Struct, frozen=True):
    """The order and the selection; never the rows themselves."""

    DEFAULT_SORT: ClassVar[str] = ""
    """The column sorted by at start, and when the one chosen is no longer shown."""
    NOT_AN_ORDER: ClassVar[frozenset[str]] = frozenset()
    """Columns the sort keys pass over."""
    NEW_COLUMN_DESCENDS: ClassVar[bool] = False
    """Whether another column sorts highest first (names first to last), or keeps the
    direction the table had."""
    ASCENDING: ClassVar[frozenset[str]] = frozenset()
    """Columns that sort first to last when `NEW_COLUMN_DESCENDS`."""

    sort_column: str = ""
    sort_reverse: bool = True
    filter_text: str = ""
    selected: str | None = None
    """The key of the row under the cursor, once the user (or the table) moved it."""
    dropped_sort: tuple[str, bool] | None = None
    """The order chosen (column, highest first) while a narrow terminal drops its column:
    back when the column is shown again, unless another order is chosen meanwhile."""

    def sort_by(self, column: str) -> Self:
        """A header clicked: that column, or the other direction when it already sorts."""
        if column == self.sort_column:
            return self.reverse()
        return self._sorted_by(column)

    def cycle_sort(self, shown: Sequence[str], step: int) -> Self:
        """The next (`step` 1) or previous (-1) of the `shown` columns."""
        keys = [key for key in shown if key not in self.NOT_AN_ORDER] or [self.DEFAULT_SORT]
        position = keys.index(self.sort_column) if self.sort_column in keys else 0
        return self._sorted_by(keys[(position + step) % len(keys)])

    def reverse(self) -> Self:
        return replace(self, sort_reverse=not self.sort_reverse, dropped_sort=None)

    def fit_columns(self, shown: Iterable[str]) -> Self:
        """The default sort while the sort column is not among those `shown` (a narrower
        terminal drops columns); the order chosen again once its column is."""
        columns = set(shown)
        if self.dropped_sort is not None and self.dropped_sort[0] in columns:
            column, reverse = self.dropped_sort
            return replace(self, sort_column=column, sort_reverse=reverse, dropped_sort=None)
        if self.sort_column in columns:
            return self
        chosen = self.dropped_sort or (self.sort_column, self.sort_reverse)
        return replace(self, sort_column=self.DEFAULT_SORT, sort_reverse=True, dropped_sort=chosen)

    def filter(self, text: str) -> Self:
        """Only the rows `text` matches (each table's view says what it understands)."""
        raise NotImplementedError

    def clear(self) -> Self:
        """Esc: no filter (each table's view says what else goes)."""
        raise NotImplementedError

    def select(self, key: str | None) -> Self:
        return self if key == self.selected else replace(self, selected=key)

    def sort_status(self, title: str) -> str:
        """`sorted by GPU-MEM ▼`, for the status line (`title`: the sort column's)."""
        return f"sorted by {title} {'▼' if self.sort_reverse else '▲'}"

    def _sorted_by(self, column: str) -> Self:
        if not self.NEW_COLUMN_DESCENDS:
            return replace(self, sort_column=column, dropped_sort=None)
        reverse = column not in self.ASCENDING
        return replace(self, sort_column=column, sort_reverse=reverse, dropped_sort=None)
