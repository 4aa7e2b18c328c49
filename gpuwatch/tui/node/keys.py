"""Every key of `gpuwatch tui`, in one table: the app binds them, `?` lists them, and the
key table in docs/guide/status.md is checked against them."""

from __future__ import annotations

from gpuwatch.tui.common import render
from gpuwatch.tui.common.keys import HELP_WIDTH, Key, filter_help, hanging, keys_help

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


def help_text(readonly: bool, width: int = HELP_WIDTH) -> render.Line:
    """Every key (those that signal only when not `readonly`), the mouse, and the filter
    syntax, `width` cells wide."""
    spans = keys_help((key for key in KEYS if not (key.writes and readonly)), width)
    mouse = "Mouse: click a row to select it, a column title to sort by it."
    spans.append(("\n" + hanging(mouse, width, 7) + "\n", ""))
    terms = "user:NAME  gpu:N[,M]  idle  WORD (in user, pid, command, lease or job)"
    spans += filter_help(terms, width)
    if readonly:
        spans.append(("\nRead-only: signals are off (--readonly).\n", ""))
    return spans
