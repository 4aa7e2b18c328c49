"""The widgets of the fleet screen. They only draw what they are given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from operator import attrgetter
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from gpuwatch.tui.fleet.cells import Column, cell_text
from gpuwatch.tui.fleet.rows import NodeRow
from gpuwatch.tui.node.widgets import REMOVE_ONE_BY_ONE_MAX, SPAN_STYLES, KeyedText, Painter

CELL_CACHE_SIZE = 20_000
"""Drawn cells kept: a tall screen's cells several times over."""
LINE_CACHE_SIZE = 2_000
"""Drawn lines kept, likewise."""

_CellDrawKey = tuple[object, ...]


class FleetTable(DataTable[Text]):
    """One row per node; rows are updated in place, cell by cell, not rebuilt.

    DataTable forgets every drawn cell whenever any cell changes, so a read that changes a
    few cells would draw the whole screen's cells again; this table keeps each drawn cell
    by what it says, so only the cells that changed are drawn again."""

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
        """Each row's cells as put into the table's data."""
        self._celled: dict[str, NodeRow] = {}
        """The row each one's cells were made from."""
        self._rows: dict[str, NodeRow] = {}
        """Each row as last shown."""
        self._shape: tuple[tuple[Column, ...], int] | None = None
        self._sorted_by: tuple[str, bool] | None = None
        self._drawn_cells: LRUCache[_CellDrawKey, list[list[Segment]]] = LRUCache(CELL_CACHE_SIZE)
        self._drawn_lines: LRUCache[_CellDrawKey, Strip] = LRUCache(LINE_CACHE_SIZE)
        self._style_this_pass: Style | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        # DataTable asks for the widget's style at every line, and each time it is worked
        # out through every ancestor's CSS: within one pass it cannot change.
        self._style_this_pass = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._style_this_pass = None

    @property
    def rich_style(self) -> Style:
        held = self._style_this_pass
        return held if held is not None else super().rich_style

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
        """Puts `rows` in the table, in their order, changing only the cells that changed,
        as they are drawn; the cursor stays on the node `selected` wherever it moved to."""
        if (columns, node_width) != self._shape:
            self._set_columns(columns, node_width)
        wanted = {row.key for row in rows}
        gone = [key for key in self._cells if key not in wanted]
        if len(gone) > REMOVE_ONE_BY_ONE_MAX:  # one by one is quadratic in DataTable
            self._empty()
        for key in gone if len(gone) <= REMOVE_ONE_BY_ONE_MAX else ():
            self.remove_row(key)
            del self._cells[key], self._celled[key]
        self._rows = {row.key: row for row in rows}
        for row in rows:
            if row.key not in self._cells:
                cells = [cell_text(row, column.key) for column in columns]
                texts = (self._text(row.key, cell, n) for n, cell in enumerate(cells))
                self.add_row(*texts, key=row.key)
                self._cells[row.key], self._celled[row.key] = cells, row
        # The other rows' cells are put in as they are drawn (`_cells_of`): a read moves
        # every node's row, but only the rows on screen need their cells again.
        self._update_count += 1
        self.refresh()
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

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        if row_index < 0 or column_index < 0:  # the header: DataTable's own cache
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        located = self._row_locations.get_key(row_index)
        row_key = (located.value if located is not None else None) or ""
        cells = self._cells_of(row_key)
        if cells is None or column_index >= len(cells):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (
            row_key,
            row_index,  # drawn into the cell, for the mouse
            column_index,
            cells[column_index],
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.app.theme,
        )
        drawn = self._drawn_cells.get(key)
        if drawn is None:
            drawn = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
            self._drawn_cells[key] = drawn
        return drawn

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        try:
            row_key, line_in_row = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        cells = self._cells_of(row_key.value or "")
        if cells is None:  # the header
            return super()._render_line(y, x1, x2, base_style)
        key = (
            y,
            x1,
            x2,
            self.size.width,
            row_key.value,
            line_in_row,
            tuple(cells),
            self._shape,
            self.cursor_coordinate,
            self.hover_coordinate,
            base_style,
            self.cursor_type,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.app.theme,
        )
        drawn = self._drawn_lines.get(key)
        if drawn is None:
            drawn = super()._render_line(y, x1, x2, base_style)
            self._drawn_lines[key] = drawn
        return drawn

    def _empty(self) -> None:
        scroll_y = self.scroll_y
        self.clear()
        self._cells.clear()
        self._celled.clear()
        self.order = []
        self.scroll_to(y=scroll_y, animate=False)

    def _set_columns(self, columns: tuple[Column, ...], node_width: int) -> None:
        self.clear(columns=True)
        self._drawn_cells.clear()
        self._drawn_lines.clear()
        self._cells.clear()
        self._celled.clear()
        self.order = []
        for column in columns:
            width = node_width if column.key == "node" else column.width
            self.add_column(column.title, width=width, key=column.key)
        self.columns_shown = columns
        self._shape = (columns, node_width)
        self._sorted_by = None

    def _cells_of(self, key: str) -> list[tuple[str, str]] | None:
        """The row `key`'s cells as of the last `show`, put into the table's data where
        they changed since it was last drawn (only a node's age, mostly, if anything)."""
        cells, row, celled = self._cells.get(key), self._rows.get(key), self._celled.get(key)
        if cells is None or row is None or celled is None or row is celled:
            return cells
        columns = self.columns_shown
        if _same_but_age(celled, row):
            fresh = [
                cell_text(row, "age") if c.key == "age" else cell
                for c, cell in zip(columns, cells, strict=True)
            ]
        else:
            fresh = [cell_text(row, column.key) for column in columns]
        if fresh != cells:
            data = self._data[RowKey(key)]
            for number, (column, old, new) in enumerate(zip(columns, cells, fresh, strict=True)):
                if old != new:
                    data[ColumnKey(column.key)] = self._text(key, new, number)
            self._cells[key] = fresh
        self._celled[key] = row
        return self._cells[key]

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


_ALL_BUT_AGE = attrgetter(*(field.name for field in fields(NodeRow) if field.name != "age_s"))


def _same_but_age(before: NodeRow, row: NodeRow) -> bool:
    return bool(_ALL_BUT_AGE(before) == _ALL_BUT_AGE(row))
