"""The widgets both screens draw text with: spans painted in the colours of the style
sheet, and a machine's GPU cards. They only draw what they are given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from gpuwatch.tui.common import render
from gpuwatch.tui.common.cards import section_lines
from gpuwatch.tui.common.layout import Layout
from gpuwatch.tui.common.section import Section

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
"""The span styles of `render`, each a component class styled in common.tcss."""
SPAN_CLASSES = frozenset(f"span--{name}" for name in SPAN_STYLES)


class Painter:
    """Turns spans into Rich text, with colours from the widget's component classes."""

    def __init__(self, widget: Widget) -> None:
        self._widget = widget
        self._styles: dict[str, Style] = {}

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

    def lines(self, lines: Sequence[render.Line]) -> Text:
        """Several lines of spans, as one text that neither wraps nor overflows."""
        text = Text("\n").join(self.text(spans) for spans in lines)
        text.no_wrap = True
        text.overflow = "crop"
        return text


class Canvas(Static):
    """A text widget whose spans take their colours from the style sheet."""

    COMPONENT_CLASSES: ClassVar[set[str]] = set(SPAN_CLASSES)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.painter = Painter(self)


class Painted(Canvas):
    """Text made of spans (help, details, the confirmation, the fleet's totals)."""

    def __init__(self, spans: render.Line, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="painted")
        self._spans = spans

    def on_mount(self) -> None:
        self.show(self._spans)

    def show(self, spans: render.Line, *, layout: bool = True) -> None:
        """`layout=False` where the widget's size is fixed by its style: the screen is not
        laid out again for it."""
        self._spans = spans
        self.update(self.painter.text(spans), layout=layout)


class SectionView(Canvas):
    """One machine: a header line, then its GPU cards, several per line when wide."""

    def __init__(self, number: int) -> None:
        super().__init__(id=f"section-{number}", classes="section")

    def show(
        self,
        section: Section,
        layout: Layout,
        monotonic_now: float,
        stalled_s: float | None,
        idle_after_s: float,
    ) -> None:
        lines = section_lines(section, layout, monotonic_now, stalled_s, idle_after_s)
        self.update(self.painter.lines(lines))
