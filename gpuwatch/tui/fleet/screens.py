"""The screens over the fleet table: a node's GPUs as cards, the users, and the help."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import FleetState, GpuJob, NodeState
from gpuwatch.tui.common import render
from gpuwatch.tui.common.layout import CHROME_LINES, MIN_TABLE_LINES, choose_layout
from gpuwatch.tui.common.section import Section
from gpuwatch.tui.fleet.cells import job_note, user_line
from gpuwatch.tui.fleet.rows import user_rows
from gpuwatch.tui.node.keys import Key
from gpuwatch.tui.node.screens import _hanging
from gpuwatch.tui.node.sources import Backfill, Frame
from gpuwatch.tui.node.widgets import Painted, SectionView

FLEET_KEYS: tuple[Key, ...] = (
    Key("question_mark", "help", "Show this help", "?", footer="help"),
    Key("q", "quit", "Quit", "q", footer="quit"),
    Key("up,down,pageup,pagedown,home,end", "", "Move the selection", "↑ ↓ PgUp PgDn Home End"),
    Key("enter", "node", "The selected node's GPUs, as cards with graphs", "Enter", footer="node"),
    Key("u", "users", "Users across the fleet (again: back to the nodes)", "u", footer="users"),
    Key("s", "next_sort", "Sort by the next column", "s", footer="sort"),
    Key("S", "previous_sort", "Sort by the previous column", "S"),
    Key("r", "reverse_sort", "Reverse the sort order", "r"),
    Key("slash", "filter", "Filter nodes: user:NAME free down idle WORD", "/", footer="filter"),
    Key("escape", "clear", "Clear the filter", "Esc"),
)
"""Every key of `gpuwatch fleet`: bound by the app, listed by `?` and in the docs."""
HELP_WIDTH = 72
_KEY_CELLS = 26


def fleet_help(width: int = HELP_WIDTH) -> render.Line:
    spans: render.Line = [("Keys\n\n", "heading")]
    for key in FLEET_KEYS:
        spans.append((f"  {key.shown:<{_KEY_CELLS - 2}}", "heading"))
        spans.append((_hanging(key.label, width, _KEY_CELLS) + "\n", ""))
    spans.append(("\nFilter (/): ", "heading"))
    terms = (
        "user:NAME (runs a process or a job there)  free (a free GPU)  down (down or stale)  "
        "idle (an idle holder)  WORD (in the name, exporter or GPU model)"
    )
    spans.append((_hanging(terms, width, 12) + "\n", ""))
    free = (
        "A GPU is free when a plain `gpuwatch pick` would take it: no lease, no other job's "
        "process, at most 1 GiB used and 5% busy, on a node that is up."
    )
    spans.append(("\n" + _hanging(free, width, 0) + "\n", "dim"))
    return spans


class FleetHelpScreen(ModalScreen[None]):
    BINDINGS = [  # noqa: RUF012 - Textual's own declaration style
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        width = min(HELP_WIDTH, self.app.size.width - 8)
        with VerticalScroll(id="help-box"):
            yield Painted(fleet_help(width), id="help-text")
            yield Painted([("Esc, q or ? closes this help", "dim")])


class FleetSection(Section):
    """A fleet node's cards, which also name the scheduler's job on each GPU as the node's
    daemon exported it (`job 4242 carol, idle 35m`), first in the card's title."""

    def __init__(self, number: int, label: str, interval_s: float) -> None:
        super().__init__(number, label, interval_s)
        self.node_jobs: tuple[GpuJob, ...] = ()

    def card_input(
        self, gpu_index: int, monotonic_now: float, card_width: int, idle_after_s: float
    ) -> render.CardInput:
        card = super().card_input(gpu_index, monotonic_now, card_width, idle_after_s)
        jobs = [job for job in self.node_jobs if job.gpu_index == gpu_index]
        note = job_note(jobs, idle_after_s)
        return replace(card, idle_note=f"{note}  {card.idle_note}".strip()) if note else card


class NodeScreen(Screen[None]):
    """One node's GPUs as the node screen draws them: cards, leases, and graphs filled
    from the source's history where it keeps one (else from this screen's reads)."""

    BINDINGS = [  # noqa: RUF012
        Binding("escape,q,enter", "dismiss", "Back to the fleet"),
    ]

    def __init__(self, node: str, interval_s: float, *, waits_for_history: bool) -> None:
        super().__init__(id="node")
        self.node = node
        self.section = FleetSection(0, node, interval_s)
        self.history_done = not waits_for_history
        self._latest: tuple[NodeState, float] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="node-box"):
            yield SectionView(0)
        yield Footer()

    def apply_history(self, series: Sequence[GpuSeries], note: str) -> None:
        """The source's past of this node: drawn once the next (or latest) read comes."""
        self.section.apply_backfill(Backfill(self.node, tuple(series), note))
        self.history_done = True
        if self._latest is not None:
            self.apply(*self._latest)

    def apply(self, node: NodeState, received_at: float) -> None:
        """A new read of the node (`received_at`: the monotonic time it came)."""
        self._latest = (node, received_at)
        if not self.history_done:
            return  # the history goes in first, or the series would drop the past
        frame = Frame(node.name, node.snapshot, node.leases or (), error=node.error, local=False)
        self.section.apply(frame, received_at)
        self.section.node_jobs = node.jobs or ()
        if node.error and not node.up:
            self.section.error = node.error

    def draw(self, monotonic_now: float, idle_after_s: float) -> None:
        width, height = self.app.size
        frame = self.section.frame
        snapshot = frame.snapshot if frame is not None else None
        gpus = [len(snapshot.gpus) if snapshot is not None else 1]
        # The cards have the whole screen: ask for a layout as if the process table were below.
        tall = (height + 1) * 5 // 3 + CHROME_LINES + MIN_TABLE_LINES
        layout = choose_layout(width, tall, gpus)
        view = self.query_one(SectionView)
        view.show(self.section, layout, monotonic_now, None, idle_after_s)


class UsersScreen(Screen[None]):
    """Who uses the fleet's GPUs: user, nodes, GPUs, GPU memory and jobs, from the
    processes and the scheduler's jobs of the nodes that are up."""

    BINDINGS = [  # noqa: RUF012
        Binding("escape,q,u", "dismiss", "Back to the fleet"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("users", id="users-title")
        with VerticalScroll(id="users-box"):
            yield Painted([], id="users-text")
        yield Footer()

    def show_fleet(self, fleet: FleetState | None) -> None:
        width = self.app.size.width - 4
        spans: render.Line = [(user_line(None, width) + "\n", "heading")]
        if fleet is None:
            spans.append(("waiting for the first read…", "dim"))
        else:
            rows, silent = user_rows(fleet)
            spans.extend((user_line(row, width) + "\n", "") for row in rows)
            if not rows:
                spans.append(("no processes on the nodes that are up\n", "dim"))
            if silent:
                nodes = "1 node tells" if silent == 1 else f"{silent} nodes tell"
                note = f"{nodes} no processes (another exporter than gpuwatch's)"
                spans.append(("\n" + note + "\n", "dim"))
        self.query_one("#users-text", Painted).show(spans)
