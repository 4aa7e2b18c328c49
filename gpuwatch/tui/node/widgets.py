"""The widgets of the main screen. They only draw what they are given."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence, Set
from dataclasses import replace
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable, Static

from gpuwatch.models import GpuSample
from gpuwatch.reports.training import TrainingReports
from gpuwatch.tui.common import render
from gpuwatch.tui.common.layout import CARD_GAP, Layout
from gpuwatch.tui.common.section import GRAPH_WINDOW_S, ScreenState, Section
from gpuwatch.tui.node.rows import Column, Row, cell_text
from gpuwatch.tui.node.sources import HostStats
from gpuwatch.tui.node.training import training_lines

REMOVE_ONE_BY_ONE_MAX = 64
"""Past this many rows gone at once, the table is emptied and refilled instead: DataTable
renumbers every row on each removal, so removing thousands one by one is quadratic."""

# The span styles of `render`, each a component class styled in gpuwatch.tcss.
SPAN_STYLES = (
    "ok",
    "warn",
    "alarm",
    "dim",
    "title",
    "label",
    "lease",
    "reserved",
    "free",
    "graph-memory",
    "graph-util",
    "tagged",
    "heading",
    "job",
)


class Painter:
    """Turns spans into Rich text, with colours from the widget's component classes."""

    def __init__(self, widget: Static | DataTable[Text]) -> None:
        self._widget = widget
        self._styles: dict[str, Style] = {}

    def reset(self) -> None:
        self._styles.clear()  # the theme or NO_COLOR may have changed

    def style(self, name: str) -> Style:
        if not name:
            return Style()
        if (style := self._styles.get(name)) is None:
            style = self._styles[name] = self._widget.get_component_rich_style(f"span--{name}")
        return style

    def text(self, spans: Iterable[render.Span]) -> Text:
        text = Text(no_wrap=True, overflow="crop")
        for content, name in spans:
            text.append(content, self.style(name))
        return text


class SectionView(Static):
    """One machine: a header line, then its GPU cards, several per line when wide."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"span--{name}" for name in SPAN_STYLES}

    def __init__(self, number: int) -> None:
        super().__init__(id=f"section-{number}", classes="section")
        self.painter = Painter(self)

    def show(
        self,
        section: Section,
        layout: Layout,
        monotonic_now: float,
        stalled_s: float | None,
        idle_after_s: float,
    ) -> None:
        frame = section.frame
        gpus = frame.snapshot.gpus if frame is not None and frame.snapshot is not None else ()
        shared = shared_error(gpus)
        width = layout.card_columns * (layout.card_width + len(CARD_GAP)) - len(CARD_GAP)
        header = _header(section, stalled_s, shared, graphs=layout.graph_rows > 0)
        lines = [self.painter.text(fit_parts(header, width))]
        if frame is not None and frame.snapshot is not None:
            cards = []
            for gpu in gpus:
                extra = section.card_input(
                    gpu.index, monotonic_now, layout.card_width, idle_after_s
                )
                if shared is not None and gpu.error == shared:
                    extra = replace(extra, error_above=True)
                cards.append(
                    render.gpu_card(
                        gpu, extra, layout.card_width, layout.graph_rows, compact=layout.compact
                    )
                )
            lines.extend(self.painter.text(spans) for spans in _side_by_side(cards, layout))
        elif section.error is None:
            lines.append(Text("waiting for the first sample…"))
        text = Text("\n").join(lines)
        text.no_wrap = True
        text.overflow = "crop"
        self.update(text)


def shared_error(gpus: Sequence[GpuSample]) -> str | None:
    """The error several GPUs report word for word (a lost driver), said once, not per card."""
    errors = Counter(gpu.error for gpu in gpus if gpu.error is not None)
    common = errors.most_common(1)
    return common[0][0] if common and common[0][1] > 1 else None


HeaderPart = tuple[int, render.Line]
"""A part of a section's header and its rank: 0 always shows, higher ranks go first."""


def fit_parts(parts: Sequence[HeaderPart], width: int) -> render.Line:
    """The parts that fit `width` cells, two spaces apart, dropping the highest ranks whole
    (a part is never cut in the middle, unless the ones that always show are too long)."""
    kept = list(parts)

    def cells(chosen: Sequence[HeaderPart]) -> int:
        return sum(len(text) for _, spans in chosen for text, _ in spans) + 2 * (len(chosen) - 1)

    while cells(kept) > width and any(rank for rank, _ in kept):
        kept.remove(max(kept, key=lambda part: part[0]))
    line: render.Line = []
    for _, spans in kept:
        if line:
            line.append(("  ", ""))
        line.extend(spans)
    return render.crop(line, width)


def _header(
    section: Section, stalled_s: float | None, shared: str | None, *, graphs: bool
) -> list[HeaderPart]:
    frame = section.frame
    parts: list[HeaderPart] = [(0, [(render.printable(section.label or "…"), "title")])]
    if frame is not None and frame.snapshot is not None:
        snapshot = frame.snapshot
        parts.append((2, [(render.clock_time(snapshot.taken_at), "label")]))
        if snapshot.driver_version:
            parts.append((3, [(f"driver {snapshot.driver_version}", "label")]))
        if snapshot.cuda_driver_version:
            parts.append((4, [(f"CUDA {snapshot.cuda_driver_version}", "label")]))
        if frame.waiters:
            parts.append((0, [(f"{len(frame.waiters)} waiting for GPUs", "warn")]))
        if shared is not None:
            count = sum(gpu.error == shared for gpu in snapshot.gpus)
            parts.append((0, [(f"{count} GPUs: {render.printable(shared)}", "alarm")]))
    if stalled_s is not None:
        parts.append((0, [(f"no sample for {stalled_s:.0f} s", "alarm")]))
    if section.error:
        parts.append((0, [(render.printable(section.error), "alarm")]))
    if frame is not None and frame.jobs is not None and frame.jobs.unknown_why is not None:
        why = render.printable(frame.jobs.unknown_why)
        parts.append((1, [(f"jobs unknown: {why}", "warn")]))
    if frame is not None and graphs:
        minutes = GRAPH_WINDOW_S / 60
        parts.append((5, [(f"graphs: {minutes:.0f} min {section.history_note}", "dim")]))
    return parts


def _side_by_side(cards: Sequence[list[render.Line]], layout: Layout) -> list[render.Line]:
    """Cards laid out `layout.card_columns` to a line, separated by `CARD_GAP`."""
    out: list[render.Line] = []
    columns = layout.card_columns
    for first in range(0, len(cards), columns):
        group = cards[first : first + columns]
        for line in range(max(len(card) for card in group)):
            spans: render.Line = []
            for position, card in enumerate(group):
                if position:
                    spans.append((CARD_GAP, "dim"))
                row = card[line] if line < len(card) else [(" " * layout.card_width, "")]
                spans.extend(row)
            out.append(spans)
    return out


class Painted(Static):
    """Text made of spans, coloured from gpuwatch.tcss (help, detail and confirmation)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"span--{name}" for name in SPAN_STYLES}

    def __init__(self, spans: render.Line, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="painted")
        self.painter = Painter(self)
        self._spans = spans

    def on_mount(self) -> None:
        self.show(self._spans)

    def show(self, spans: render.Line, *, layout: bool = True) -> None:
        """`layout=False` where the widget's size is fixed by its style: the screen is not
        laid out again for it."""
        self._spans = spans
        self.update(self.painter.text(spans), layout=layout)


class HostLine(Static):
    """CPU, memory, swap and load of this machine."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"span--{name}" for name in SPAN_STYLES}

    def __init__(self) -> None:
        super().__init__(id="host")
        self.painter = Painter(self)

    def show(self, stats: HostStats | None, width: int) -> None:
        if stats is None:
            self.update(
                self.painter.text([("host: CPU, memory and load of this machine only", "dim")])
            )
            return
        bar = 10 if width >= 100 else 6
        memory = (
            stats.memory_used_bytes / stats.memory_total_bytes if stats.memory_total_bytes else None
        )
        swap = stats.swap_used_bytes / stats.swap_total_bytes if stats.swap_total_bytes else None
        cpu: render.Line = [("CPU ", "label")]
        cpu += render.percent_bar(stats.cpu_pct, bar, render.THRESHOLDS.busy)
        cpu.append(
            (
                f" {stats.cpu_pct:3.0f}% of {stats.cpu_count}",
                render.level(stats.cpu_pct / 100, render.THRESHOLDS.busy),
            )
        )
        mem: render.Line = [("MEM ", "label")]
        mem += render.percent_bar(
            None if memory is None else memory * 100, bar, render.THRESHOLDS.memory
        )
        mem.append(
            (
                f" {render.size(stats.memory_used_bytes)}/{render.size(stats.memory_total_bytes)}",
                render.level(memory, render.THRESHOLDS.memory),
            )
        )
        swp: render.Line = [("SWP ", "label")]
        if swap is None:
            swp.append(("none", "dim"))
        else:
            swp.append(
                (
                    f"{render.size(stats.swap_used_bytes)}/{render.size(stats.swap_total_bytes)}",
                    render.level(swap, render.THRESHOLDS.memory),
                )
            )
        load_level = render.level(stats.load_1m / stats.cpu_count, (0.8, 1.5))
        loads = f"{stats.load_1m:.2f} {stats.load_5m:.2f} {stats.load_15m:.2f}"
        # All three loads when they fit, else the last minute's, else none; swap goes first.
        spans: render.Line = []
        for shown in (loads, f"{stats.load_1m:.2f}"):
            load: render.Line = [("LOAD ", "label"), (shown, load_level)]
            spans = fit_parts([(0, cpu), (0, mem), (2, swp), (1, load)], width)
            if shown in "".join(text for text, _ in spans):
                break
        self.update(self.painter.text(spans))


class Panel(Static):
    """A panel another part of gpuwatch adds to the main screen (`GpuwatchApp(panels=...)`).

    It sits between the host line and the process table, and is handed the screen's state
    after every frame; style it in gpuwatch.tcss by its id or class.
    """

    def show_state(self, state: ScreenState, now: float) -> None:
        """Redraws from `state` (`now` is the app's clock)."""


class TrainingPanel(Panel):
    """Each process `gpuwatch.torch.watch()` watches on this machine (`tui.training`), as
    the latest frames brought them; the panel hides itself while there are none."""

    def __init__(self) -> None:
        super().__init__(id="training")
        self.found = TrainingReports()
        self.display = False
        self._shown: tuple[tuple[int, ...], int] | None = None

    def show_state(self, state: ScreenState, now: float) -> None:
        found = [s.frame.training for s in state.sections if s.frame is not None]
        width = max(20, self.size.width or 120)
        shown = (tuple(id(f) for f in found), width)
        if shown == self._shown:
            return  # the same reads as last time (frames carry them until the next read)
        self._shown = shown
        self.found = TrainingReports(
            tuple(r for f in found for r in f.reports), sum(f.skipped for f in found)
        )
        self.display = bool(self.found.reports)
        self.update("\n".join(training_lines(self.found, width)))


class KeyedText(Text):
    """A cell that knows its row, so rows can be put in an order of our choosing."""

    row_key: str = ""


class ProcessTable(DataTable[Text]):
    """Processes, leases and waiting jobs; rows are updated in place, not rebuilt."""

    COMPONENT_CLASSES: ClassVar[set[str]] = DataTable.COMPONENT_CLASSES | {
        f"span--{name}" for name in SPAN_STYLES
    }
    # DataTable scrolls sideways on Home and End; in a list of processes they select
    # the first and the last, as in top and nvitop.
    BINDINGS: ClassVar[list[Binding | tuple[str, str] | tuple[str, str, str]]] = [
        Binding("home", "first_row", "First", show=False),
        Binding("end", "last_row", "Last", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(id="processes", cursor_type="row", zebra_stripes=False)
        self.painter = Painter(self)
        self.columns_shown: tuple[Column, ...] = ()
        self.order: list[str] = []
        self._cells: dict[str, list[tuple[str, str]]] = {}
        self._rows: dict[str, Row] = {}
        self._sorted_by: tuple[str, bool] | None = None
        self._width = 0

    def action_first_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)

    def row(self, key: str) -> Row | None:
        return self._rows.get(key)

    @property
    def rows_by_key(self) -> dict[str, Row]:
        """The rows shown, by key (for the model to pick signal targets from)."""
        return self._rows

    def current_row(self, selected: str | None) -> Row | None:
        """The row `selected` (a key), or before any is, the row under the cursor."""
        if self.row_count == 0:
            return None
        if selected is None:
            selected = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return self._rows.get(selected or "")

    def show(
        self,
        rows: Sequence[Row],
        columns: tuple[Column, ...],
        now: float,
        tagged: Set[str],
        sorted_by: tuple[str, bool],
        width: int,
        selected: str | None = None,
    ) -> None:
        """Puts `rows` in the table, in their order, changing only the cells that changed;
        the cursor stays on the row `selected` wherever it moved to."""
        if columns != self.columns_shown or width != self._width:
            self._set_columns(columns, width)
        wanted = {row.key for row in rows}
        gone = [key for key in self._cells if key not in wanted]
        if len(gone) > REMOVE_ONE_BY_ONE_MAX:
            self._empty()
        for key in gone if len(gone) <= REMOVE_ONE_BY_ONE_MAX else ():
            self.remove_row(key)
            del self._cells[key]
        self._rows = {row.key: row for row in rows}
        for row in rows:
            cells = [cell_text(row, column, now, row.key in tagged) for column in columns]
            self._put(row.key, cells, columns)
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
                label = column.title + arrow
                self.columns[column.key].label = Text(label)  # type: ignore[index]

    def _empty(self) -> None:
        """Drops every row, keeping the columns and the scroll position; the rows that stay
        are added again, in order, by the caller."""
        scroll_y = self.scroll_y
        self.clear()
        self._cells.clear()
        self.order = []
        self.scroll_to(y=scroll_y, animate=False)

    def _set_columns(self, columns: tuple[Column, ...], width: int) -> None:
        self.clear(columns=True)
        self._cells.clear()
        self.order = []
        fixed = sum(c.width + 2 for c in columns if c.key != "command")
        for column in columns:
            size = column.width if column.key != "command" else max(16, width - fixed - 3)
            self.add_column(column.title, width=size, key=column.key)
        self.columns_shown = columns
        self._width = width
        self._sorted_by = None

    def _put(self, key: str, cells: list[tuple[str, str]], columns: tuple[Column, ...]) -> None:
        before = self._cells.get(key)
        if before is None:
            self.add_row(*(self._text(key, c) for c in cells), key=key)
        else:
            for column, old, new in zip(columns, before, cells, strict=True):
                if old != new:
                    self.update_cell(key, column.key, self._text(key, new))
        self._cells[key] = cells

    def _text(self, key: str, cell: tuple[str, str]) -> KeyedText:
        text = KeyedText(
            cell[0], style=self.painter.style(cell[1]), no_wrap=True, overflow="ellipsis"
        )
        text.row_key = key
        return text

    def _restore_cursor(self, key: str | None) -> None:
        if key is None or key not in self._cells:
            return
        index = self.get_row_index(key)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False, scroll=False)
