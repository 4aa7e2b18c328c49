"""The widgets of `gpuwatch tui`'s main screen besides the cards and the table (which both
screens share): the host line and the panels. They only draw what they are given."""

from __future__ import annotations

from textual.widgets import Static

from gpuwatch.reports.training import TrainingReports
from gpuwatch.tui.common import render
from gpuwatch.tui.common.cards import fit_parts
from gpuwatch.tui.common.frames import HostStats
from gpuwatch.tui.common.widgets import Canvas
from gpuwatch.tui.node.state import ScreenState
from gpuwatch.tui.node.training import training_lines


class HostLine(Canvas):
    """CPU, memory, swap and load of this machine."""

    def __init__(self) -> None:
        super().__init__(id="host")

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
    after every frame; style it in node.tcss by its id or class.
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
