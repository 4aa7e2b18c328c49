"""The screens over the main one: help, process detail, and the signal confirmation."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Static

from gpuwatch.tui import render
from gpuwatch.tui.details import ProcessDetails
from gpuwatch.tui.keys import KEYS
from gpuwatch.tui.rows import Row
from gpuwatch.tui.signals import Plan
from gpuwatch.tui.trends import ProcessTrend


def help_text(readonly: bool) -> Text:
    """Every key, and the filter syntax."""
    text = Text()
    text.append("Keys\n\n", style="bold")
    for key in KEYS:
        if key.writes and readonly:
            continue
        text.append(f"  {key.shown:<24}", style="bold")
        text.append(f"{key.label}\n")
    text.append("\nMouse: click a row to select it, a column title to sort by it.\n")
    text.append("\nFilter (/): ", style="bold")
    text.append("user:NAME  gpu:N[,M]  idle  WORD (in user, pid, command or lease)\n")
    if readonly:
        text.append("\nRead-only: signals are off (--readonly).\n")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's own declaration style
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(self, readonly: bool) -> None:
        super().__init__(id="help")
        self._readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(help_text(self._readonly), id="help-text")
            yield Static(Text("Esc, q or ? closes this help", style="dim"))


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
            yield Static(id="detail-graphs")
            yield Static(self._static_part(), id="detail-text")
        yield Footer()

    def refresh_from(self, row: Row | None, trend: ProcessTrend | None, width: int) -> None:
        """Redraws the graphs with the latest samples (`row` is None once the process is gone)."""
        if row is not None:
            self.row = row
        self.query_one("#detail-graphs", Static).update(
            graphs_text(self.row, trend, width, gone=row is None)
        )

    def _static_part(self) -> Text:
        return details_text(self.row, self._details)


def graphs_text(row: Row, trend: ProcessTrend | None, width: int, *, gone: bool) -> Text:
    text = Text(no_wrap=True, overflow="crop")
    gpu = "-" if row.gpu is None else str(row.gpu)
    text.append(f"pid {row.pid}", style="bold")
    text.append(f"  user {render.printable(row.user or '?')}  GPU {gpu}  {row.kind}")
    if gone:
        text.append("  (no longer on the GPU)", style="bold red")
    text.append("\n")
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
        text.append(f"\n{title}: {now} now (top of graph {top}, one cell per sample)\n")
        for line in render.sparkline(values, 3):
            text.append(line + "\n", style="cyan")
    return text


def details_text(row: Row, details: ProcessDetails) -> Text:
    text = Text()
    text.append("\nCommand\n", style="bold")
    text.append(
        render.printable(details.command or row.command or "(not visible from here)") + "\n"
    )
    if row.wants:
        text.append(f"\nWaiting for: {row.wants}\n")
    if row.lease:
        text.append(f"\nLease: {render.printable(row.lease)}\n")
    if row.idle is not None:
        prefix = "at least " if row.idle.at_least else ""
        idle = f"{prefix}{render.duration(row.idle.seconds)}"
        text.append(f"\nIdle holder: its GPU has been idle for {idle}\n", style="bold")
    text.append("\nParents (nearest first)\n", style="bold")
    text.append("\n".join(details.parents) + "\n")
    text.append("\nEnvironment\n", style="bold")
    text.append("\n".join(details.environment) + "\n")
    return text


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
            yield Static(confirm_text(self.signal_name, self.plan), id="confirm-text")
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


def confirm_text(signal_name: str, plan: Plan) -> Text:
    text = Text()
    if plan.as_root:
        text.append("You are root: this can stop anyone's job.\n\n", style="bold reverse")
    if plan.targets:
        text.append(f"Send {signal_name} to:\n", style="bold")
        for target in plan.targets:
            command = render.fit(render.printable(target.command), 60).rstrip()
            text.append(f"  pid {target.pid}  {render.printable(target.user)}  {command}\n")
    else:
        text.append(f"No process to send {signal_name} to.\n", style="bold")
    if plan.refused:
        text.append("\nLeft out:\n", style="bold")
        for reason in plan.refused:
            text.append(f"  {render.printable(reason)}\n")
    return text
