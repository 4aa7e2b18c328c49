"""`FleetApp`: the fleet screen. It is handed a fleet source and never opens one.

A reader thread calls `source.read()` every interval and posts `FleetRead`; a node's
history (for its cards' graphs) is read on a thread of its own and posted as
`HistoryRead`. A source that reads nodes as per-node figures is told which node's detail
is open (`focus`), and reads that one GPU by GPU. The UI thread only draws: the table's
rows are updated in place, and what the user chose (sort, filter, selection) is a
`model.FleetView`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Footer, Input, Static

from gpuwatch.errors import GpuwatchError
from gpuwatch.fleet.source import FleetSource
from gpuwatch.fleet_model import FleetState
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.tui.common.app import DEFAULT_IDLE_AFTER_S, TableApp
from gpuwatch.tui.common.screens import HelpScreen
from gpuwatch.tui.common.section import GRAPH_WINDOW_S
from gpuwatch.tui.common.table import RowTable
from gpuwatch.tui.common.widgets import Painted
from gpuwatch.tui.fleet.cells import cell_text, columns_for, node_width, totals_line
from gpuwatch.tui.fleet.keys import FLEET_KEYS, fleet_help
from gpuwatch.tui.fleet.model import FleetView
from gpuwatch.tui.fleet.rows import IdleTracker, NodeRow, RowMemory, build_rows, totals
from gpuwatch.tui.fleet.screens import NodeScreen, UsersScreen

DEFAULT_INTERVAL_S = 2.0
READER_EXIT_WAIT_S = 2.0


@dataclass
class FleetRead(Message):
    """The source said something: a fleet, or why it could not be read at all."""

    fleet: FleetState | None
    error: str | None = None


@dataclass
class HistoryRead(Message):
    """A node's past, for its cards' graphs."""

    node: str
    series: Sequence[GpuSeries]
    note: str


class FleetApp(TableApp[FleetView, NodeRow]):
    """Every node of a fleet, one row each, with the fleet's totals above."""

    CSS_PATH = ["../common/common.tcss", "fleet.tcss"]  # noqa: RUF012 - Textual's declaration style
    TITLE = "gpuwatch fleet"
    FILTER_ON_ENTER = True

    def __init__(
        self,
        source: FleetSource,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        monotonic: Callable[[], float] = time.monotonic,
        sample: bool = True,
        first: FleetState | None = None,
    ) -> None:
        """`monotonic` measures idle times and graphs; `sample=False` starts no reader, so
        fleets come only from `feed()`; `first` is a read already made (the command makes
        one, to fail before the screen opens when the source cannot be read at all)."""
        super().__init__(
            FleetView(),
            FLEET_KEYS,
            interval_s=interval_s,
            idle_after_s=idle_after_s,
            monotonic=monotonic,
            sample=sample,
        )
        self.source = source
        self.fleet: FleetState | None = None
        self.error: str | None = None
        self.idle = IdleTracker()
        self._row_memory = RowMemory()
        self._rows: list[NodeRow] = []
        """Every node's row as of the latest read: keys re-sort and filter these, and only a
        read builds them again."""
        self._first = first
        self._read_first = first is not None
        """The reader's first read waits an interval: the command made one just now."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set to read at once, not at the next interval (a node's detail opened)."""
        self._reader: threading.Thread | None = None
        self._drawn = False
        self._lines_shown: tuple[list[tuple[str, str]], str] | None = None
        """The totals and the status line as last shown."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Over a node or the users, the table's keys are off (and out of the footer)."""
        return len(self.screen_stack) <= 1 or action == "help"

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        yield Painted([("reading the fleet…", "dim")], id="totals")
        yield RowTable[NodeRow](id="nodes")
        yield Static(id="status")
        yield Input(
            placeholder="filter: user:NAME free down idle WORD   (Enter applies, Esc clears)",
            id="filter",
        )
        yield Footer()

    def on_mount(self) -> None:
        if self.sample:
            self._reader = threading.Thread(
                target=self._read_loop, name="gpuwatch-fleet-reader", daemon=True
            )
            self._reader.start()

    def on_ready(self) -> None:
        self._drawn = True
        self.query_one("#title", Static).update(
            f"gpuwatch fleet  ·  {self.source.description}  ·  ? help  q quit"
        )
        self.table().focus()
        if self._first is not None:
            first, self._first = self._first, None
            self.feed(first)
        self.redraw()

    def on_unmount(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._reader is not None:
            self._reader.join(READER_EXIT_WAIT_S)  # a daemon thread: a hung read ends with us

    def _read_loop(self) -> None:
        due = time.monotonic()
        if self._read_first:
            due = self._sleep_until(due + self.interval_s)
        while not self._stop.is_set():
            try:
                message = FleetRead(self.source.read())
            except GpuwatchError as error:
                message = FleetRead(None, str(error))
            except Exception as error:  # a fault in one read never ends the screen
                message = FleetRead(None, f"unexpected {type(error).__name__}: {error}")
            self.post_message(message)
            # Reads start every interval, however long each takes (a slow Prometheus).
            due = self._sleep_until(max(due + self.interval_s, time.monotonic()))

    def _sleep_until(self, due: float) -> float:
        """Waits until `due` (monotonic), or less where the reader is woken; returns when
        the next read starts, from which the one after is due."""
        woken = self._wake.wait(max(0.0, due - time.monotonic()))
        self._wake.clear()
        return time.monotonic() if woken else due

    # --- data -----------------------------------------------------------------------------

    def feed(self, fleet: FleetState | None, error: str | None = None) -> None:
        """Applies a read as if the reader had posted it."""
        now = self.monotonic()
        self.error = error
        if fleet is not None:
            self.fleet = fleet
            self.idle.observe(fleet, now)
            self._rows = build_rows(fleet, self.idle.idle_for, self.idle_after_s, self._row_memory)
            for screen in self.screen_stack:
                if isinstance(screen, NodeScreen):
                    node = next((n for n in fleet.nodes if n.key == screen.node), None)
                    if node is not None:
                        screen.section.apply_node(node, now)
        self.redraw()

    @on(FleetRead)
    def _fleet_read(self, message: FleetRead) -> None:
        self.feed(message.fleet, message.error)

    @on(HistoryRead)
    def _history_read(self, message: HistoryRead) -> None:
        for screen in self.screen_stack:
            if isinstance(screen, NodeScreen) and screen.node == message.node:
                screen.section.apply_history(message.series, message.note)
        self.redraw()

    def rows(self) -> list[NodeRow]:
        """Every node's row as of the latest read, in the fleet's order."""
        return self._rows

    def current_rows(self) -> list[NodeRow]:
        """The rows shown, filtered and sorted."""
        return self.view.arrange(self.rows())

    # --- drawing --------------------------------------------------------------------------

    def redraw(self) -> None:
        if not self._drawn:
            return
        with contextlib.suppress(NoMatches):  # shutting down: the widgets are going
            self._redraw()

    def _redraw(self) -> None:
        everything = self.rows()
        width = self.size.width
        columns = columns_for(width)
        self.view = self.view.fit_columns(c.key for c in columns)
        shown = self.view.arrange(everything)
        longest = max((len(row.shown_name) for row in everything), default=0)
        name_width = node_width(columns, width, longest)
        # Ages are of the read's time; before the first read nothing has one.
        now = self.fleet.taken_at if self.fleet is not None else 0.0
        self.table().show(
            shown,
            lambda row: [cell_text(row, column.key, now) for column in columns],
            columns,
            [name_width if c.key == "node" else c.width for c in columns],
            (self.view.sort_column, self.view.sort_reverse),
            self.view.selected,
        )
        spans = totals_line(totals(everything)) if self.fleet is not None else []
        if self.error:
            spans = [*spans, ("  ", ""), (self.error, "alarm")]
        spans = spans or [("reading the fleet…", "dim")]
        status = self.view.status(len(shown), len(everything))
        if (spans, status) != self._lines_shown:
            # Both are one line high (fleet.tcss, common.tcss): no need to lay out the
            # screen again, which would draw every widget of it again.
            self._lines_shown = (spans, status)
            self.home.query_one("#totals", Painted).show(spans, layout=False)
            self.home.query_one("#status", Static).update(status, layout=False)
        self._redraw_over()

    def _redraw_over(self) -> None:
        screen = self.screen
        if isinstance(screen, NodeScreen):
            screen.draw(self.monotonic(), self.idle_after_s)
        elif isinstance(screen, UsersScreen):
            screen.show_fleet(self.fleet)

    # --- actions --------------------------------------------------------------------------

    def selected_node(self) -> str | None:
        row = self.selected_row()
        return None if row is None else row.node

    def open_row(self) -> None:
        self.action_node()

    def action_node(self) -> None:
        node = self.selected_node()
        if node is None or len(self.screen_stack) > 1:
            return  # Enter reaches both the table and the app: open one node only
        history = getattr(self.source, "history", None)
        screen = NodeScreen(node, self.interval_s, waits_for_history=callable(history))
        self.push_screen(screen, callback=self._node_closed)
        self._focus((node,))
        if self.fleet is not None:
            state = next((n for n in self.fleet.nodes if n.key == node), None)
            if state is not None:
                screen.section.apply_node(state, self.monotonic())
        if callable(history):
            threading.Thread(target=self._read_history, args=(history, node), daemon=True).start()
        self.call_after_refresh(self.redraw)

    def _node_closed(self, _: None) -> None:
        self._focus(())

    def _focus(self, nodes: tuple[str, ...]) -> None:
        """Tells a source that reads per-node figures which nodes to read GPU by GPU,
        and reads at once when one opens."""
        focus = getattr(self.source, "focus", None)
        if callable(focus):
            focus(nodes)
            if nodes:
                self._wake.set()

    def _read_history(self, history: Callable[..., Sequence[GpuSeries]], node: str) -> None:
        try:
            series = history(node, duration_s=GRAPH_WINDOW_S)
            note = f"from {self.source.description}"
        except Exception as error:  # the past is a nicety: the cards come anyway
            series, note = (), f"no history ({error})"
        self.post_message(HistoryRead(node, series, note))

    def action_users(self) -> None:
        if isinstance(self.screen, UsersScreen):
            self.pop_screen()
            return
        if len(self.screen_stack) > 1:
            return
        self.push_screen(UsersScreen(id="users"))
        self.call_after_refresh(self.redraw)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(fleet_help))
