"""The screen both apps open on `?`: every key, and what the filter understands."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

from gpuwatch.tui.common import render
from gpuwatch.tui.common.keys import HELP_WIDTH
from gpuwatch.tui.common.widgets import Painted


class HelpScreen(ModalScreen[None]):
    """The help, as wide as the terminal allows (`text` makes it for a width)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
    ]

    def __init__(self, text: Callable[[int], render.Line]) -> None:
        super().__init__(id="help")
        self._text = text

    def compose(self) -> ComposeResult:
        width = min(HELP_WIDTH, self.app.size.width - 8)
        with VerticalScroll(id="help-box"):
            yield Painted(self._text(width), id="help-text")
            yield Painted([("Esc, q or ? closes this help", "dim")])
