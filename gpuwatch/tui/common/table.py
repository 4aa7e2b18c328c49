"""The one table widget: the process table of `gpuwatch tui` and the node table of
`gpuwatch fleet`. It only draws what it is given, through DataTable's public API."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Generic, Protocol, TypeVar

import msgspec
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.styled import Styled
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import PseudoClasses
from textual.widgets import DataTable

from gpuwatch.tui.common import render
from gpuwatch.tui.common.columns import Column
from gpuwatch.tui.common.widgets import SPAN_CLASSES, Painter

LINES_KEPT = 2_000
"""Drawn lines kept for rows that did not change: a tall screen's lines several times over."""
CELLS_KEPT = 20_000
"""Drawn cells kept for cells that did not change, likewise."""
REMOVE_ONE_BY_ONE_MAX = 64
"""Past this many rows gone at once, the table is emptied and refilled instead: DataTable
renumbers every row on each removal, so removing thousands one by one is quadratic."""


class Keyed(Protocol):
    """A row: its key names it from one refresh to the next."""

    @property
    def key(self) -> str: ...


R = TypeVar("R", bound=Keyed)


class _Look(msgspec.Struct, frozen=True):
    """What a line of the table looks like besides what its row says."""

    style: Style
    pseudo_classes: PseudoClasses
    theme: str
    width: int
    scroll_x: int
    columns: tuple[str, ...]
    widths: tuple[int, ...]


class KeyedText(Text):
    """A cell that knows its row, so rows can be put in an order of our choosing."""

    row_key: str = ""


class RowTable(DataTable[Text], Generic[R]):
    """Rows of type `R`, one per key, in the order given; rows are updated in place, cell
    by cell, not rebuilt, and the cursor stays on the row chosen wherever it moves to.

    DataTable draws every cell again whenever any cell changed, so a refresh that changes a
    few cells of a large table would draw the whole screen's cells again (at 500 nodes, most
    of what the fleet screen cost). This table draws the lines of its rows itself (Textual's
    line API, `render_line`), as DataTable draws them (a test holds the two alike), keeping
    each line and each cell it drew by what it says: a refresh draws again only the cells
    that changed. The header, and the lines under the cursor and the mouse, DataTable draws.

    DataTable measures every cell of every row added, so a row added off screen is added
    blank (its DataTable cells empty) and gets its cells once it comes into view: a table
    filled again (the first read, a filter cleared) makes and measures the text of the
    rows on screen only."""

    COMPONENT_CLASSES: ClassVar[set[str]] = DataTable.COMPONENT_CLASSES | SPAN_CLASSES
    # DataTable scrolls sideways on Home and End; in a list of processes or nodes they
    # select the first and the last, as in top and nvitop.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("home", "first_row", "First", show=False),
        Binding("end", "last_row", "Last", show=False),
    ]

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.painter = Painter(self)
        self.columns_shown: tuple[Column[R], ...] = ()
        self.order: list[str] = []
        """The rows' keys, top to bottom."""
        self._cells: dict[str, tuple[render.Span, ...]] = {}
        """Each row's cells as put into the table."""
        self._rows: dict[str, R] = {}
        """Each row as last shown."""
        self._stale: set[str] = set()
        """The rows whose cells are due again (each call of `show` makes them all so), made
        when they are on screen."""
        self._cells_of: Callable[[R], Sequence[render.Span]] = lambda row: ()
        self._widths: tuple[int, ...] = ()
        self._sorted_by: tuple[str, bool] | None = None
        self._lines: dict[tuple[object, ...], Strip] = {}
        """Lines drawn, by what they show; the oldest first."""
        self._cell_lines: dict[tuple[object, ...], list[Segment]] = {}
        """Cells drawn, by what they show; the oldest first."""
        self._look: _Look | None = None
        """What every line of this drawing pass depends on besides its row."""

    def render_lines(self, crop: Region) -> list[Strip]:
        self._put_in_view()  # rows scrolled into view since the last refresh
        self._look = self._looks_now()
        try:
            return super().render_lines(crop)
        finally:
            self._look = None

    def render_line(self, y: int) -> Strip:
        """Line `y` of the widget, as drawn before where it says the same at the same place.
        Rows' lines it draws itself; the header and the cursor's row DataTable draws; and
        while the mouse is over the table, the lines it may light up, DataTable every time
        (how the mouse lights them up is DataTable's own)."""
        header = self.header_height if self.show_header else 0
        index = y + self.scroll_offset.y - header
        if y >= header and not 0 <= index < len(self.order):
            return super().render_line(y)
        if self.mouse_hover and (y < header or index in (self.cursor_row, self.hover_row)):
            return super().render_line(y)
        look = self._look or self._looks_now()
        if y < header:
            drawn: tuple[object, ...] = ("header", y, self._sorted_by, look)
            return self._kept(drawn, lambda: super(RowTable, self).render_line(y))
        key = self.order[index]
        if not self._cells[key]:
            self._put_in_view()  # a blank row scrolled into view, drawn before the pass
        cells = self._cells[key]
        if index == self.cursor_row:
            drawn = (key, index, cells, look, "cursor")
            return self._kept(drawn, lambda: super(RowTable, self).render_line(y))
        drawn = (key, index, cells, look)  # the index is in it, for the mouse
        return self._kept(drawn, lambda: self._draw_row(index, cells, look))

    def _kept(self, drawn: tuple[object, ...], draw: Callable[[], Strip]) -> Strip:
        """The line `drawn` describes, as drawn before, else drawn now (and kept)."""
        line = self._lines.pop(drawn, None)
        if line is None:
            line = draw()
        self._lines[drawn] = line
        if len(self._lines) > LINES_KEPT:
            del self._lines[next(iter(self._lines))]
        return line

    def _looks_now(self) -> _Look:
        return _Look(
            self.rich_style,
            self.get_pseudo_class_state(),
            self.app.theme,
            self.size.width,
            self.scroll_offset.x,
            tuple(column.key for column in self.columns_shown),
            self._widths,
        )

    def _draw_row(self, index: int, cells: tuple[render.Span, ...], look: _Look) -> Strip:
        """Row `index`'s line, as DataTable draws a line without the cursor or the mouse on
        it: each cell padded and in the widget's style, marked with its place (for the
        mouse), then the rest of the width, marked as out of the table."""
        segments: list[Segment] = []
        table_width = 0
        for number, (cell, column) in enumerate(zip(cells, self.columns_shown, strict=True)):
            width = self.columns[column.key].get_render_width(self)  # type: ignore[index]
            segments += self._draw_cell(cell, column, (index, number, width), look)
            table_width += width
        rest = Style.from_meta({"row": index, "column": 0, "out_of_bounds": True})
        segments.append(Segment(" " * max(0, look.width - table_width), look.style + rest))
        x, width = look.scroll_x, look.width
        return Strip(segments).crop(x, x + width).adjust_cell_length(width, look.style).simplify()

    def _draw_cell(
        self, cell: render.Span, column: Column[R], place: tuple[int, int, int], look: _Look
    ) -> list[Segment]:
        """A cell, padded, in the widget's style, marked with its `place` (row, column and
        width: the mouse finds the cell by it)."""
        drawn = (cell, place, look)
        segments = self._cell_lines.pop(drawn, None)
        if segments is None:
            index, number, width = place
            style = look.style + Style.from_meta({"row": index, "column": number})
            padded = Styled(Padding(self._text("", cell, column), (0, self.cell_padding)), style)
            options = self.app.console_options.update_dimensions(width, 1).update(no_wrap=True)
            segments = self.app.console.render_lines(padded, options)[0]
        self._cell_lines[drawn] = segments
        if len(self._cell_lines) > CELLS_KEPT:
            del self._cell_lines[next(iter(self._cell_lines))]
        return segments

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)

    def row(self, key: str) -> R | None:
        return self._rows.get(key)

    @property
    def rows_by_key(self) -> Mapping[str, R]:
        """The rows shown, by key."""
        return self._rows

    def current_row(self, selected: str | None) -> R | None:
        """The row `selected` (a key) while it is shown, else the row under the cursor."""
        if self.row_count == 0:
            return None
        if selected is None or selected not in self._rows:
            selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self._rows.get(selected or "")

    def show(
        self,
        rows: Sequence[R],
        cells: Callable[[R], Sequence[render.Span]],
        columns: tuple[Column[R], ...],
        widths: Sequence[int],
        sorted_by: tuple[str, bool],
        selected: str | None,
    ) -> None:
        """Puts `rows` in the table, in their order, changing only the cells that changed;
        the cursor stays on the row `selected`. Every row's `cells` (text and style name, one
        per column of `columns`, `widths` wide) are due again at each call, the very same
        row's too (a cell may say how long ago something was): they are made for the rows
        on screen, and for a row off screen once it comes into view."""
        if columns != self.columns_shown or tuple(widths) != self._widths:
            self._set_columns(columns, widths)
        wanted = {row.key for row in rows}
        gone = [key for key in self._cells if key not in wanted]
        if len(gone) > REMOVE_ONE_BY_ONE_MAX:
            self._empty()
        else:
            for key in gone:
                self.remove_row(key)
                del self._cells[key]
        self._rows = {row.key: row for row in rows}
        self._cells_of = cells
        top = self.scroll_offset.y
        in_view = range(top, top + self.size.height)
        for index, row in enumerate(rows):
            if row.key not in self._cells:
                self._add(row.key, cells(row) if index in in_view else None)
        order = [row.key for row in rows]
        relabelled = sorted_by != self._sorted_by
        if relabelled:
            self._label(sorted_by)
        if order != self.order or relabelled:  # sorting draws the header again, too
            rank = {key: position for position, key in enumerate(order)}
            self.sort(columns[0].key, key=lambda cell: rank.get(cell.row_key, 0))
            self.order = order
        self._restore_cursor(selected)
        self._stale = set(order)
        self._put_in_view()

    def _put_in_view(self) -> None:
        """Puts the cells of the rows on screen that are due (those that changed)."""
        if not self._stale:
            return
        top = self.scroll_offset.y
        for key in self.order[top : top + self.size.height]:
            if key in self._stale:
                self._stale.discard(key)
                self._put(key, self._cells_of(self._rows[key]))

    def _add(self, key: str, shown: Sequence[render.Span] | None) -> None:
        """Adds row `key` with its cells `shown`, or where it is off screen (`None`),
        blank: its cells are put once it comes into view. A blank row costs DataTable less
        than a full one (10,000 rows, the fleet's first frame: 2.8 s before, 1.6 s;
        bench/fleet_screen_scale.py)."""
        columns = self.columns_shown
        if shown is None:
            self.add_row(self._text(key, ("", ""), columns[0]), key=key)
            self._cells[key] = ()
            return
        cells = tuple(shown)
        texts = [self._text(key, cell, c) for cell, c in zip(cells, columns, strict=True)]
        self.add_row(*texts, key=key)
        self._cells[key] = cells

    def _put(self, key: str, shown: Sequence[render.Span]) -> None:
        """Puts the cells of row `key` that changed (all of them, where it was blank)."""
        cells = tuple(shown)
        before = self._cells[key] or ((None, None),) * len(cells)
        if before != cells:
            for column, old, new in zip(self.columns_shown, before, cells, strict=True):
                if old != new:
                    self.update_cell(key, column.key, self._text(key, new, column))
        self._cells[key] = cells

    def _text(self, key: str, cell: render.Span, column: Column[R]) -> KeyedText:
        text = KeyedText(
            cell[0],
            style=self.painter.style(cell[1]),
            no_wrap=True,
            overflow="ellipsis",
            justify=column.justify,
        )
        text.row_key = key
        return text

    def _label(self, sorted_by: tuple[str, bool]) -> None:
        """The sort column's title with its arrow, the others' plain."""
        self._sorted_by = sorted_by
        key, reverse = sorted_by
        for column in self.columns_shown:
            arrow = (" ▼" if reverse else " ▲") if column.key == key else ""
            self.columns[column.key].label = Text(column.title + arrow)  # type: ignore[index]

    def _empty(self) -> None:
        """Drops every row, keeping the columns and the scroll position; the rows that stay
        are added again, in order."""
        scroll_y = self.scroll_y
        self.clear()
        self._cells.clear()
        self._stale.clear()
        self.order = []
        self.scroll_to(y=scroll_y, animate=False)

    def _set_columns(self, columns: tuple[Column[R], ...], widths: Sequence[int]) -> None:
        self.clear(columns=True)
        self._cells.clear()
        self._stale.clear()
        self.order = []
        for column, width in zip(columns, widths, strict=True):
            self.add_column(column.title, width=width, key=column.key)
        self.columns_shown = columns
        self._widths = tuple(widths)
        self._sorted_by = None

    def _restore_cursor(self, key: str | None) -> None:
        if key is None or key not in self._cells:
            return
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False, scroll=False)
