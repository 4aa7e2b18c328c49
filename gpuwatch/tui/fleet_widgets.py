"""The widgets of the fleet screen. They only draw what they are given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from gpuwatch.tui.fleet_cells import Column, cell_text
from gpuwatch.tui.fleet_rows import NodeRow
from gpuwatch.tui.widgets import REMOVE_ONE_BY_ONE_MAX, SPAN_STYLES, KeyedText, Painter


class FleetTable(DataTable[Text]):
    """One row per node; rows are updated in place, cell by cell, not rebuilt."""

    COMPONENT_CLASSES: ClassVar[set[str]] = DataTable.COMPONENT_CLASSES | {
        f"span--{name}" for name in SPAN_STYLES
    }
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        Binding("home", "first_row", "First", show=False),
        Binding("end", "last_row", "Last", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="nodes", cursor_type="row", zebra_stripes=False)
        self.painter = Painter(self)
        self.columns_shown: tuple[Column, ...] = ()
        self.order: list[str] = []
        self._cells: dict[str, list[tuple[str, str]]] = {}
        self._rows: dict[str, NodeRow] = {}
        self._shape: tuple[tuple[Column, ...], int] | None = None
        self._sorted_by: tuple[str, bool] | None = None

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)

    def current_row(self, selected: str | None) -> NodeRow | None:
        """The row `selected` (a node name), or before any is, the row under the cursor."""
        if self.row_count == 0:
            return None
        if selected is None or selected not in self._rows:
            selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self._rows.get(selected or "")

    def show(
        self,
        rows: Sequence[NodeRow],
        columns: tuple[Column, ...],
        node_width: int,
        sorted_by: tuple[str, bool],
        selected: str | None,
    ) -> None:
        """Puts `rows` in the table, in their order, changing only the cells that changed;
        the cursor stays on the node `selected` wherever it moved to."""
        if (columns, node_width) != self._shape:
            self._set_columns(columns, node_width)
        wanted = {row.key for row in rows}
        gone = [key for key in self._cells if key not in wanted]
        if len(gone) > REMOVE_ONE_BY_ONE_MAX:  # one by one is quadratic in DataTable
            self._empty()
        for key in gone if len(gone) <= REMOVE_ONE_BY_ONE_MAX else ():
            self.remove_row(key)
            del self._cells[key]
        self._rows = {row.key: row for row in rows}
        for row in rows:
            self._put(row.key, [cell_text(row, column.key) for column in columns], columns)
        order = [row.key for row in rows]
        if order != self.order:
            rank = {key: position for position, key in enumerate(order)}
            self.sort(columns[0].key, key=lambda cell: rank.get(cell.row_key, 0))
            self.order = order
        self._restore_cursor(selected)
        if sorted_by != self._sorted_by:
            self._sorted_by = sorted_by
            key, reverse = sorted_by
            for column in columns:
                arrow = (" ▼" if reverse else " ▲") if column.key == key else ""
                self.columns[column.key].label = Text(column.title + arrow)  # type: ignore[index]

    def _empty(self) -> None:
        scroll_y = self.scroll_y
        self.clear()
        self._cells.clear()
        self.order = []
        self.scroll_to(y=scroll_y, animate=False)

    def _set_columns(self, columns: tuple[Column, ...], node_width: int) -> None:
        self.clear(columns=True)
        self._cells.clear()
        self.order = []
        for column in columns:
            width = node_width if column.key == "node" else column.width
            self.add_column(column.title, width=width, key=column.key)
        self.columns_shown = columns
        self._shape = (columns, node_width)
        self._sorted_by = None

    def _put(self, key: str, cells: list[tuple[str, str]], columns: tuple[Column, ...]) -> None:
        before = self._cells.get(key)
        if before is None:
            self.add_row(*(self._text(key, c, n) for n, c in enumerate(cells)), key=key)
        else:
            for number, (column, old, new) in enumerate(zip(columns, before, cells, strict=True)):
                if old != new:
                    self.update_cell(key, column.key, self._text(key, new, number))
        self._cells[key] = cells

    def _text(self, key: str, cell: tuple[str, str], number: int) -> KeyedText:
        # Figures align right, as in a spreadsheet; the node name (first) to the left.
        text = KeyedText(
            cell[0],
            style=self.painter.style(cell[1]),
            no_wrap=True,
            overflow="ellipsis",
            justify="left" if number == 0 else "right",
        )
        text.row_key = key
        return text

    def _restore_cursor(self, key: str | None) -> None:
        if key is None or key not in self._cells:
            return
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False, scroll=False)
