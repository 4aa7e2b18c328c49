"""The screens over the fleet table: a node's GPUs as cards, and the users."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpuwatch.models import FleetState
from gpuwatch.tui.common.widgets import Painted, SectionView
from gpuwatch.tui.fleet.cells import users_text
from gpuwatch.tui.fleet.node_cards import FleetSection, node_layout


class NodeScreen(Screen[None]):
    """One node's GPUs as the node screen draws them: cards, leases, and graphs filled
    from the source's history where it keeps one (else from this screen's reads)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "dismiss", "Back to the fleet"),
    ]

    def __init__(self, node: str, interval_s: float, *, waits_for_history: bool) -> None:
        super().__init__(id="node")
        self.node = node
        self.section = FleetSection(node, interval_s, waits_for_history=waits_for_history)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="node-box"):
            yield SectionView(0)
        yield Footer()

    def draw(self, monotonic_now: float, idle_after_s: float) -> None:
        layout = node_layout(self.section, *self.app.size)
        self.query_one(SectionView).show(self.section, layout, monotonic_now, None, idle_after_s)


class UsersScreen(Screen[None]):
    """Who uses the fleet's GPUs: user, nodes, GPUs, GPU memory and jobs, from the
    processes and the scheduler's jobs of the nodes that are up."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,u", "dismiss", "Back to the fleet"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("users", id="users-title")
        with VerticalScroll(id="users-box"):
            yield Painted([], id="users-text")
        yield Footer()

    def show_fleet(self, fleet: FleetState | None) -> None:
        self.query_one("#users-text", Painted).show(users_text(fleet, self.app.size.width - 4))
