"""The screens over the main one: help, process detail, and the signal confirmation."""

from __future__ import annotations

import textwrap

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer

from gpuwatch.tui.common import render
from gpuwatch.tui.common.trends import ProcessTrend
from gpuwatch.tui.node.details import ProcessDetails
from gpuwatch.tui.node.keys import KEYS
from gpuwatch.tui.node.rows import Row
from gpuwatch.tui.node.signals import Plan
from gpuwatch.tui.node.widgets import Painted

HELP_WIDTH = 72
"""The help text's width at most (the box is 80 wide: border, padding and scroll bar take 6)."""
_KEY_CELLS = 26


def help_text(readonly: bool, width: int = HELP_WIDTH) -> render.Line:
    """Every key, and the filter syntax, `width` cells wide: a description too long for
    its line goes on under itself, not under the keys."""
    spans: render.Line = []
    spans.append(("Keys\n\n", "heading"))
    for key in KEYS:
        if key.writes and readonly:
            continue
        spans.append((f"  {key.shown:<{_KEY_CELLS - 2}}", "heading"))
        spans.append((_hanging(key.label, width, _KEY_CELLS) + "\n", ""))
    mouse = "Mouse: click a row to select it, a column title to sort by it."
    spans.append(("\n" + _hanging(mouse, width, 7) + "\n", ""))
    spans.append(("\nFilter (/): ", "heading"))
    terms = "user:NAME  gpu:N[,M]  idle  WORD (in user, pid, command, lease or job)"
    spans.append((_hanging(terms, width, 12) + "\n", ""))
    if readonly:
        spans.append(("\nRead-only: signals are off (--readonly).\n", ""))
    return spans


def _hanging(text: str, width: int, indent: int) -> str:
    """`text` wrapped to the cells right of `indent`, its later lines indented to match."""
    lines = textwrap.wrap(text, max(10, width - indent), break_on_hyphens=False)
    return ("\n" + " " * indent).join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's own declaration style
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(self, readonly: bool) -> None:
        super().__init__(id="help")
        self._readonly = readonly

    def compose(self) -> ComposeResult:
        width = min(HELP_WIDTH, self.app.size.width - 8)
        with VerticalScroll(id="help-box"):
            yield Painted(help_text(self._readonly, width), id="help-text")
            yield Painted([("Esc, q or ? closes this help", "dim")])


class DetailScreen(Screen[None]):
    """One process: graphs of its GPU memory and CPU, its command, parents, environment."""

    BINDINGS = [  # noqa: RUF012
        Binding("escape,q,enter", "dismiss", "Back"),
    ]

    def __init__(self, row: Row, details: ProcessDetails) -> None:
        super().__init__(id="detail")
        self.row = row
        self._details = details

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-box"):
            yield Painted([], id="detail-graphs")
            yield Painted(self._static_part(), id="detail-text")
        yield Footer()

    def refresh_from(self, row: Row | None, trend: ProcessTrend | None, width: int) -> None:
        """Redraws the graphs with the latest samples (`row` is None once the process is gone)."""
        if row is not None:
            self.row = row
        self.query_one("#detail-graphs", Painted).show(
            graphs_text(self.row, trend, width, gone=row is None)
        )

    def _static_part(self) -> render.Line:
        return details_text(self.row, self._details)


def graphs_text(row: Row, trend: ProcessTrend | None, width: int, *, gone: bool) -> render.Line:
    spans: render.Line = []
    gpu = "-" if row.gpu is None else str(row.gpu)
    spans.append((f"pid {row.pid}", "heading"))
    spans.append((f"  user {render.printable(row.user or '?')}  GPU {gpu}  {row.kind}", ""))
    if gone:
        spans.append(("  (no longer on the GPU)", "alarm"))
    spans.append(("\n", ""))
    cells = max(10, width - 14)
    memory = trend.memory_bytes.latest(cells) if trend else []
    cpu = trend.cpu_pct.latest(cells) if trend else []
    peak = max((v for v in memory if v is not None), default=0.0) or 1.0
    cpu_peak = max(100.0, max((v for v in cpu if v is not None), default=0.0))
    for title, values, top, now in (
        (
            "GPU memory",
            [None if v is None else v / peak for v in memory],
            render.size(int(peak)),
            render.size(row.gpu_memory_bytes),
        ),
        (
            "CPU",
            [None if v is None else v / cpu_peak for v in cpu],
            f"{cpu_peak:.0f}%",
            "-" if row.cpu_pct is None else f"{row.cpu_pct:.0f}%",
        ),
    ):
        spans.append((f"\n{title}: {now} now (top of graph {top}, one cell per sample)\n", ""))
        for line in render.sparkline(values, 3):
            spans.append((line + "\n", "graph-memory"))
    return spans


def details_text(row: Row, details: ProcessDetails) -> render.Line:
    spans: render.Line = []
    spans.append(("\nCommand\n", "heading"))
    spans.append(
        (render.printable(details.command or row.command or "(not visible from here)") + "\n", "")
    )
    if row.wants:
        spans.append((f"\nWaiting for: {row.wants}\n", ""))
    if row.lease:
        spans.append((f"\nLease: {render.printable(row.lease)}\n", ""))
    if row.idle is not None:
        prefix = "at least " if row.idle.at_least else ""
        idle = f"{prefix}{render.duration(row.idle.seconds)}"
        spans.append((f"\nIdle holder: its GPU has been idle for {idle}\n", "heading"))
    spans.append(("\nParents (nearest first)\n", "heading"))
    spans.append(("\n".join(details.parents) + "\n", ""))
    spans.append(("\nEnvironment\n", "heading"))
    spans.append(("\n".join(details.environment) + "\n", ""))
    return spans


class ConfirmScreen(ModalScreen[bool]):
    """Asks before sending a signal, naming every process it would reach."""

    BINDINGS = [  # noqa: RUF012
        Binding("y", "answer(True)", "Yes, send it"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, signal_name: str, plan: Plan) -> None:
        super().__init__(id="confirm")
        self.signal_name = signal_name
        self.plan = plan

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Painted(confirm_text(self.signal_name, self.plan), id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                if self.plan.targets:
                    yield Button(f"Send {self.signal_name} (y)", id="yes", variant="error")
                yield Button("Cancel (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes and bool(self.plan.targets))


def confirm_text(signal_name: str, plan: Plan) -> render.Line:
    spans: render.Line = []
    if plan.as_root:
        spans.append(("You are root: this can stop anyone's job.\n\n", "alarm"))
    if plan.targets:
        spans.append((f"Send {signal_name} to:\n", "heading"))
        for target in plan.targets:
            command = render.fit(render.printable(target.command), 60).rstrip()
            spans.append((f"  pid {target.pid}  {render.printable(target.user)}  {command}\n", ""))
    else:
        spans.append((f"No process to send {signal_name} to.\n", "heading"))
    if plan.refused:
        spans.append(("\nLeft out:\n", "heading"))
        for reason in plan.refused:
            spans.append((f"  {render.printable(reason)}\n", ""))
    return spans
