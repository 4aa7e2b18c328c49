"""`TableApp`: what both apps share, the one set of actions on their table: sort, filter,
select and open a row, from keys, the mouse and the filter field."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar

from textual import on
from textual.app import App
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Input

from gpuwatch.tui.common.keys import Key
from gpuwatch.tui.common.table import Keyed, RowTable
from gpuwatch.tui.common.view import TableChoices

V = TypeVar("V", bound=TableChoices)
R = TypeVar("R", bound=Keyed)
DEFAULT_IDLE_AFTER_S = 600.0
"""Both apps call a process an idle holder once its GPU has been idle this long."""


class TableApp(App[int], Generic[V, R]):
    """An app whose first screen shows one `RowTable`, a filter field (`#filter`) and a
    status line; `view` is what the user chose about the table, and each key maps to one of
    its transitions. An app says how it draws (`redraw`) and what Enter opens (`open_row`).

    Both apps read on threads of their own every `interval_s`, call a holder idle after
    `idle_after_s`, and measure time with `monotonic`; `sample=False` starts no thread, so
    data comes only from the app's `feed()` (as tests do)."""

    FILTER_ON_ENTER: ClassVar[bool] = False
    """Whether the filter applies when Enter is pressed in its field, not as it is typed:
    a table of thousands of rows (a fleet's) would be filtered and filled again at each
    keystroke (10,000 nodes: 2.2 s to type a node's name, bench/fleet_screen_scale.py)."""

    def __init__(
        self,
        view: V,
        keys: Iterable[Key],
        *,
        interval_s: float,
        idle_after_s: float,
        monotonic: Callable[[], float],
        sample: bool,
    ) -> None:
        super().__init__()
        self.view = view
        self.interval_s = interval_s
        self.idle_after_s = idle_after_s
        self.monotonic = monotonic
        self.sample = sample
        for key in keys:
            if key.action:
                self.bind(key.keys, key.action, description=key.footer, show=bool(key.footer))

    @property
    def home(self) -> Screen[Any]:
        """The screen the table is on: the first, under any other opened."""
        if not self.screen_stack:
            raise NoMatches("the app has no screen (it is shutting down)")
        return self.screen_stack[0]

    def table(self) -> RowTable[R]:
        return self.home.query_one(RowTable)

    def redraw(self) -> None:
        """Draws everything the view or the data may have changed."""
        raise NotImplementedError

    def open_row(self) -> None:
        """Enter on a row."""
        raise NotImplementedError

    def on_resize(self) -> None:
        self.redraw()

    def selected_row(self) -> R | None:
        """The row chosen, or before any is, the row under the cursor; it stays chosen as
        rows move."""
        row = self.table().current_row(self.view.selected)
        if row is not None:
            self.view = self.view.select(row.key)
        return row

    # --- sorting --------------------------------------------------------------------------

    def _cycle_sort(self, step: int) -> None:
        shown = [column.key for column in self.table().columns_shown]
        self.view = self.view.cycle_sort(shown, step)
        self.redraw()

    def action_next_sort(self) -> None:
        self._cycle_sort(1)

    def action_previous_sort(self) -> None:
        self._cycle_sort(-1)

    def action_reverse_sort(self) -> None:
        self.view = self.view.reverse()
        self.redraw()

    @on(DataTable.HeaderSelected)
    def _header_clicked(self, event: DataTable.HeaderSelected) -> None:
        self.view = self.view.sort_by(str(event.column_key.value))
        self.redraw()

    # --- selection ------------------------------------------------------------------------

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.view = self.view.select(event.row_key.value)

    @on(DataTable.RowSelected)
    def _row_selected(self) -> None:
        self.open_row()

    # --- the filter -----------------------------------------------------------------------

    def action_filter(self) -> None:
        field = self.home.query_one("#filter", Input)
        field.display = True
        field.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        if not self.FILTER_ON_ENTER:
            self._apply_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        self.home.query_one("#filter", Input).display = False
        self.table().focus()
        if self.FILTER_ON_ENTER:
            self._apply_filter(event.value)

    def _apply_filter(self, text: str) -> None:
        if text != self.view.filter_text:
            self.view = self.view.filter(text)
            self.redraw()

    def action_clear(self) -> None:
        field = self.home.query_one("#filter", Input)
        field.value = ""
        field.display = False
        self.view = self.view.clear()
        self.table().focus()
        self.redraw()

    async def action_quit(self) -> None:
        self.exit(0)
