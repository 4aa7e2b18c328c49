"""Every key of `gpuwatch tui`, in one table: the app binds them, `?` lists them, and the
key table in docs/guide/status.md is checked against them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Key:
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


KEYS: tuple[Key, ...] = (
    Key("question_mark", "help", "Show this help", "?", footer="help"),
    Key("q", "quit", "Quit", "q", footer="quit"),
    Key("up,down,pageup,pagedown,home,end", "", "Move the selection", "↑ ↓ PgUp PgDn Home End"),
    Key(
        "tab,shift+tab",
        "",
        "Switch between the process table and the GPU cards (then ↑ ↓ scroll the cards)",
        "Tab Shift+Tab",
    ),
    Key("enter", "detail", "Details of the selected process", "Enter", footer="details"),
    Key("s", "next_sort", "Sort by the next column", "s", footer="sort"),
    Key("S", "previous_sort", "Sort by the previous column", "S"),
    Key("r", "reverse_sort", "Reverse the sort order", "r"),
    Key("slash", "filter", "Filter rows: user:NAME gpu:N idle WORD", "/", footer="filter"),
    Key("T", "tree", "Tree view: processes under their parents (again: a flat list)", "T"),
    Key("escape", "clear", "Clear the filter and the tags", "Esc"),
    Key("space", "tag", "Tag or untag the selected process", "Space"),
    Key(
        "i",
        "signal('SIGINT')",
        "Send SIGINT to the tagged or selected processes (asks first)",
        "i",
        writes=True,
    ),
    Key(
        "t",
        "signal('SIGTERM')",
        "Send SIGTERM to the tagged or selected processes (asks first)",
        "t",
        writes=True,
        footer="SIGTERM",
    ),
    Key(
        "k",
        "signal('SIGKILL')",
        "Send SIGKILL to the tagged or selected processes (asks first)",
        "k",
        writes=True,
    ),
)
