"""A screen's keys, and its help text: each screen lists its keys in one table (the app
binds them, `?` lists them, the docs' key tables are checked against them).

Pure, and without Textual.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import msgspec

from gpuwatch.tui.common import render

HELP_WIDTH = 72
"""The help text's width at most (the box is 80 wide: border, padding and scroll bar take 6)."""
KEY_CELLS = 26
"""Cells before a key's description in the help."""


class Key(msgspec.Struct, frozen=True):
    """One key of a screen: what Textual binds, the action it runs, and how people see it."""

    keys: str
    """Textual key names, comma-separated."""
    action: str
    label: str
    """What the help screen and the docs say it does."""
    shown: str
    """How the key is written for people."""
    writes: bool = False
    """Acts on processes: not bound under --readonly."""
    footer: str = ""
    """The short name in the footer; not in the footer when empty."""


HEAD_KEYS = (
    Key("question_mark", "help", "Show this help", "?", footer="help"),
    Key("q", "quit", "Quit", "q", footer="quit"),
    Key("up,down,pageup,pagedown,home,end", "", "Move the selection", "↑ ↓ PgUp PgDn Home End"),
)
"""The keys every screen's table begins with."""
SORT_KEYS = (
    Key("s", "next_sort", "Sort by the next column", "s", footer="sort"),
    Key("S", "previous_sort", "Sort by the previous column", "S"),
    Key("r", "reverse_sort", "Reverse the sort order", "r"),
)
"""The keys of `TableApp`'s sort actions, the same on every screen."""


def keys_help(keys: Iterable[Key], width: int) -> render.Line:
    """`Keys`, then each key and what it does, `width` cells wide: a description too long
    for its line goes on under itself, not under the keys."""
    spans: render.Line = [("Keys\n\n", "heading")]
    for key in keys:
        spans.append((f"  {key.shown:<{KEY_CELLS - 2}}", "heading"))
        spans.append((hanging(key.label, width, KEY_CELLS) + "\n", ""))
    return spans


def filter_help(terms: str, width: int) -> render.Line:
    """`Filter (/):` and what the filter understands."""
    return [("\nFilter (/): ", "heading"), (hanging(terms, width, 12) + "\n", "")]


def hanging(text: str, width: int, indent: int) -> str:
    """`text` wrapped to the cells right of `indent`, its later lines indented to match."""
    lines = textwrap.wrap(text, max(10, width - indent), break_on_hyphens=False)
    return ("\n" + " " * indent).join(lines)
