"""`GpuwatchApp`: the live screen. It is handed its sources and never opens a backend.

Each source runs on its own sampling thread, which posts `FrameArrived`
messages; the UI thread only draws. A source that hangs stops only its own
thread, and its section says for how long it has had no sample. What the user
chose about the table (sort, filter, tags, tree view, selection) is a
`model.TableView`: keys map to its transitions, and the table draws what it says.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence

from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Footer, Input, Static

from gpuwatch.tui.common.app import TableApp
from gpuwatch.tui.common.frames import Ancestor, Backfill, Frame, HostStats
from gpuwatch.tui.common.layout import Layout, choose_layout
from gpuwatch.tui.common.screens import HelpScreen
from gpuwatch.tui.common.table import RowTable
from gpuwatch.tui.common.widgets import SectionView
from gpuwatch.tui.node.details import read_details, remote_details
from gpuwatch.tui.node.keys import KEYS, help_text
from gpuwatch.tui.node.model import TableView
from gpuwatch.tui.node.rows import Row, cell_text, column_widths, columns_for
from gpuwatch.tui.node.sampler import SAMPLER_EXIT_WAIT_S, Sampler
from gpuwatch.tui.node.screens import ConfirmScreen, DetailScreen
from gpuwatch.tui.node.signals import plan, send
from gpuwatch.tui.node.sources import Source
from gpuwatch.tui.node.state import ScreenState
from gpuwatch.tui.node.widgets import HostLine, Panel

DEFAULT_IDLE_AFTER_S = 600.0


class FrameArrived(Message):
    """Source `number` said something: a frame, good or failed."""

    def __init__(self, number: int, frame: Frame) -> None:
        super().__init__()
        self.number = number
        self.frame = frame


class BackfillArrived(Message):
    """Source `number`'s past (the daemon's history, when it keeps one), once, first."""

    def __init__(self, number: int, backfill: Backfill) -> None:
        super().__init__()
        self.number = number
        self.backfill = backfill


class GpuwatchApp(TableApp[TableView, Row]):
    """The GPUs, processes, leases and waiting jobs of one or several machines."""

    CSS_PATH = ["../common/common.tcss", "node.tcss"]  # noqa: RUF012 - Textual's declaration style
    TITLE = "gpuwatch"

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        interval_s: float = 1.0,
        readonly: bool = False,
        idle_after_s: float = DEFAULT_IDLE_AFTER_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sample: bool = True,
        as_root: bool | None = None,
        panels: Sequence[Panel] = (),
    ) -> None:
        """`clock` gives the wall time shown (clock times, running times); `monotonic` orders
        samples and measures graphs, idle times and stalls, whatever the wall clock does;
        `sample=False` starts no threads, so frames come only from `feed()`; `as_root`
        defaults to the truth."""
        super().__init__(TableView(), (key for key in KEYS if not (key.writes and readonly)))
        self.sources = list(sources)
        self.interval_s = interval_s
        self.readonly = readonly
        self.idle_after_s = idle_after_s
        self.clock = clock
        self.monotonic = monotonic
        self.state = ScreenState([s.label for s in self.sources], interval_s)
        self._sample = sample
        self.panels = list(panels)
        self.as_root = os.geteuid() == 0 if as_root is None else as_root
        self._samplers: list[Sampler] = []
        self._opened_at = monotonic()
        self._stalled_after_s = max(3 * interval_s, 2.0)
        self._layout: Layout | None = None
        self._mounted_once = False
        self._shown_stalled = False

    # --- building -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="title")
        with VerticalScroll(id="gpus"):
            for number in range(len(self.sources)):
                yield SectionView(number)
        yield HostLine()
        yield from self.panels
        yield RowTable[Row](id="processes")
        yield Static(id="status")
        yield Input(
            placeholder="filter: user:NAME gpu:N idle WORD   (Enter keeps, Esc clears)", id="filter"
        )
        yield Footer()

    def on_mount(self) -> None:
        # Sampling starts while the screen is still being built: the first frame is
        # then waiting for it, not the other way round.
        if self._sample:
            for number, source in enumerate(self.sources):
                sampler = Sampler(
                    number,
                    source,
                    self.interval_s,
                    on_backfill=lambda n, past: self.post_message(BackfillArrived(n, past)),
                    on_frame=lambda n, frame: self.post_message(FrameArrived(n, frame)),
                )
                self._samplers.append(sampler)
                sampler.start()

    def on_ready(self) -> None:
        self._mounted_once = True
        self._draw_title()
        self.table().focus()
        self.set_interval(1.0, self._watch_stalls)
        self.redraw()

    def on_unmount(self) -> None:
        for sampler in self._samplers:
            sampler.stop.set()
        # Let each sampler finish its current read (a remote one closes its ssh), but never
        # wait long on one stuck in the driver: it is a daemon thread, the exit ends it.
        deadline = time.monotonic() + SAMPLER_EXIT_WAIT_S
        for sampler in self._samplers:
            sampler.join(max(0.0, deadline - time.monotonic()))

    # --- data -----------------------------------------------------------------------------

    def feed(self, number: int, frame: Frame) -> None:
        """Applies a frame as if its sampler had posted it."""
        self.state.apply(number, frame, self.monotonic())
        self.redraw()
        self._refresh_detail()

    @on(FrameArrived)
    def _frame_arrived(self, message: FrameArrived) -> None:
        self.feed(message.number, message.frame)

    @on(BackfillArrived)
    def _backfill_arrived(self, message: BackfillArrived) -> None:
        self.state.sections[message.number].apply_backfill(message.backfill)

    def _watch_stalls(self) -> None:
        """Between frames, redraws only to say (or stop saying) that samples are late."""
        monotonic = self.monotonic()
        stalled = any(
            s.stalled_s(monotonic, self._stalled_after_s, self._opened_at) is not None
            for s in self.state.sections
        )
        if stalled or self._shown_stalled:
            self._shown_stalled = stalled
            with contextlib.suppress(NoMatches):
                self._draw_sections()

    # --- drawing --------------------------------------------------------------------------

    def redraw(self) -> None:
        if not self._mounted_once:
            return
        # While shutting down the widgets are gone, but a frame may still be queued.
        with contextlib.suppress(NoMatches):
            self._redraw()

    def _redraw(self) -> None:
        sections = self.state.sections
        self._layout = choose_layout(
            self.size.width,
            self.size.height,
            [len(s.frame.snapshot.gpus) if s.frame and s.frame.snapshot else 1 for s in sections],
            [
                len(s.frame.snapshot.mig_devices) if s.frame and s.frame.snapshot else 0
                for s in sections
            ],
        )
        self.home.query_one("#gpus").styles.height = self._layout.gpu_panel_lines
        self._draw_sections()
        self.home.query_one(HostLine).show(self._host_stats(), self.size.width - 2)
        for panel in self.panels:
            panel.show_state(self.state, self.clock())
        self._draw_table()
        self._draw_status()

    def _draw_title(self) -> None:
        parts = ["gpuwatch", "? help  q quit"]
        if self.readonly:
            parts.append("read-only")
        elif self.as_root:
            parts.append("as root: signals reach every user's processes")
        self.home.query_one("#title", Static).update("  ·  ".join(parts))

    def _draw_sections(self) -> None:
        if self._layout is None:
            return
        monotonic = self.monotonic()
        views = list(self.home.query(SectionView))
        if len(views) != len(self.state.sections):
            return  # shutting down: the widgets are going
        for section, view in zip(self.state.sections, views, strict=True):
            stalled = section.stalled_s(monotonic, self._stalled_after_s, self._opened_at)
            view.show(section, self._layout, monotonic, stalled, self.idle_after_s)

    def _host_stats(self) -> HostStats | None:
        for section in self.state.sections:
            if section.frame is not None and section.frame.host is not None:
                return section.frame.host
        return None

    # What the table shows, as the model says (read by tests and panels).
    @property
    def sort_column(self) -> str:
        return self.view.sort_column

    @property
    def sort_reverse(self) -> bool:
        return self.view.sort_reverse

    @property
    def tagged(self) -> frozenset[str]:
        return self.view.tagged

    @property
    def tree_view(self) -> bool:
        return self.view.tree

    def current_rows(self) -> list[Row]:
        everything = self.state.rows(self.clock(), self.monotonic(), self.idle_after_s)
        return self.view.arrange(everything, self._ancestors())

    def _ancestors(self) -> list[tuple[str, dict[int, Ancestor]]]:
        if not self.view.tree:
            return []
        return [
            (section.label, {a.pid: a for a in section.frame.ancestors})
            for section in self.state.sections
            if section.frame is not None and section.frame.ancestors
        ]

    def _draw_table(self) -> None:
        width = self.size.width
        columns = columns_for(width, several_hosts=len(self.sources) > 1, jobs=self._jobs_shown())
        self.view = self.view.fit_columns(c.key for c in columns)
        rows = self.current_rows()
        self.view = self.view.keep_tags(row.key for row in rows)
        now, tagged = self.clock(), self.view.tagged
        self.table().show(
            rows,
            lambda row: [cell_text(row, column, now, row.key in tagged) for column in columns],
            columns,
            column_widths(columns, width),
            (self.view.sort_column, self.view.sort_reverse),
            self.view.selected,
        )

    def _jobs_shown(self) -> bool:
        """Whether a section's GPUs are a scheduler's to give (the JOB column is shown)."""
        return any(
            s.frame is not None and s.frame.jobs is not None and s.frame.jobs.scheduler
            for s in self.state.sections
        )

    def _draw_status(self) -> None:
        self.home.query_one("#status", Static).update(self.view.status())

    # --- actions --------------------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen(lambda width: help_text(self.readonly, width)))

    def action_tree(self) -> None:
        self.view = self.view.toggle_tree()
        for source in self.sources:
            source.tree = self.view.tree  # the next frame brings the ancestors
        self.redraw()

    def action_tag(self) -> None:
        row = self.selected_row()
        if row is not None:
            self.view = self.view.toggle_tag(row.key)
            self.redraw()

    def open_row(self) -> None:
        self.action_detail()

    def action_detail(self) -> None:
        row = self.selected_row()
        if row is None or len(self.screen_stack) > 1:
            return  # Enter reaches both the table and the app: open one detail only
        details = read_details(row.pid) if row.local else remote_details()
        self.push_screen(DetailScreen(row, details))
        self.call_after_refresh(self._refresh_detail)

    def _refresh_detail(self) -> None:
        screen = self.screen_stack[-1] if self.screen_stack else None
        if isinstance(screen, DetailScreen):
            key = screen.row.key
            row = next(
                (
                    r
                    for r in self.state.rows(self.clock(), self.monotonic(), self.idle_after_s)
                    if r.key == key
                ),
                None,
            )
            screen.refresh_from(row, self.state.process_trends.get(key), self.size.width)

    def action_signal(self, name: str) -> None:
        chosen = self.view.targets(self.table().rows_by_key, self.selected_row())
        if not chosen:
            self.notify_status("select or tag a process first")
            return
        proposal = plan(chosen)

        def answered(yes: bool | None) -> None:
            if yes:
                self.notify_status("; ".join(send(proposal.targets, name)))
                self.view = self.view.untag_all()
            self.redraw()

        self.push_screen(ConfirmScreen(name, proposal), answered)

    def notify_status(self, text: str) -> None:
        self.view = self.view.say(text)
        self._draw_status()
