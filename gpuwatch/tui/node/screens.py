"""The screens over `gpuwatch tui`'s main one: a process's detail, and the signal
confirmation (the help is `common.screens.HelpScreen`)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer

from gpuwatch.tui.common.trends import ProcessTrend
from gpuwatch.tui.common.widgets import Painted
from gpuwatch.tui.node.details import ProcessDetails, details_text, graphs_text
from gpuwatch.tui.node.rows import Row
from gpuwatch.tui.node.signals import Plan, confirm_text


class DetailScreen(Screen[None]):
    """One process: graphs of its GPU memory and CPU, its command, parents, environment."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "dismiss", "Back"),
    ]

    def __init__(self, row: Row, details: ProcessDetails) -> None:
        super().__init__(id="detail")
        self.row = row
        self._details = details

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail-box"):
            yield Painted([], id="detail-graphs")
            yield Painted(details_text(self.row, self._details), id="detail-text")
        yield Footer()

    def refresh_from(self, row: Row | None, trend: ProcessTrend | None, width: int) -> None:
        """Redraws the graphs with the latest samples (`row` is None once the process is gone)."""
        if row is not None:
            self.row = row
        self.query_one("#detail-graphs", Painted).show(
            graphs_text(self.row, trend, width, gone=row is None)
        )


class ConfirmScreen(ModalScreen[bool]):
    """Asks before sending a signal, naming every process it would reach."""

    BINDINGS: ClassVar[list[BindingType]] = [
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
