"""Every key of `gpuwatch fleet`, in one table: the app binds them, `?` lists them, and the
key table in docs/guide/fleet-screen.md is checked against them."""

from __future__ import annotations

from gpuwatch.tui.common import render
from gpuwatch.tui.common.keys import HEAD_KEYS, SORT_KEYS, Key, filter_help, hanging, keys_help

FLEET_KEYS: tuple[Key, ...] = (
    *HEAD_KEYS,
    Key("enter", "node", "The selected node's GPUs, as cards with graphs", "Enter", footer="node"),
    Key("u", "users", "Users across the fleet (again: back to the nodes)", "u", footer="users"),
    *SORT_KEYS,
    Key("slash", "filter", "Filter, on Enter: user:NAME free down idle WORD", "/", footer="filter"),
    Key("escape", "clear", "Clear the filter", "Esc"),
)
"""Every key of `gpuwatch fleet`: bound by the app, listed by `?` and in the docs."""


def fleet_help(width: int) -> render.Line:
    """Every key, the filter syntax and when a GPU counts as free, `width` cells wide."""
    spans = keys_help(FLEET_KEYS, width)
    terms = (
        "user:NAME (runs a process or a job there)  free (a free GPU)  down (down or stale)  "
        "idle (an idle holder)  WORD (in the name, exporter or GPU model)"
    )
    spans += filter_help(terms, width)
    free = (
        "A GPU is free when a plain `gpuwatch pick` would take it: no lease, no other job's "
        "process, at most 1 GiB used and 5% busy, on a node that is up."
    )
    spans.append(("\n" + hanging(free, width, 0) + "\n", "dim"))
    return spans
