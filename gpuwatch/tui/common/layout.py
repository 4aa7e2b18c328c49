"""How the screen is divided, from its size and the number of GPUs.

GPU cards come first, as many per line as fit; their graphs are the first
thing to go when room is short, then each card shrinks to one line (then, in the
process table, the least needed columns: see `rows.columns_for`). The process
table keeps at least two fifths of the height.
"""

from __future__ import annotations

import math

import msgspec

CHROME_LINES = 4
"""Title, host line, status line and key footer."""
MIN_CARD_WIDTH = 78
GRAPH_MIN_CARD_WIDTH = 60
MIN_TABLE_LINES = 6
CARD_GAP = " │ "
"""Between cards side by side: a rule, so that one card's end never reads as the next's start."""


class Layout(msgspec.Struct, frozen=True):
    """The screen as `choose_layout` divides it: cards per line, each card's width and graph
    rows, and the lines of the GPU panel."""

    card_columns: int
    card_width: int
    graph_rows: int
    gpu_panel_lines: int
    """Lines given to the GPU cards; fewer than they need means the panel scrolls."""
    compact: bool = False
    """One line per card: name, memory, utilization and temperature."""


def card_lines(graph_rows: int, *, compact: bool = False) -> int:
    """A card: title, bars, graphs; or one line."""
    return 1 if compact else 2 + graph_rows


def choose_layout(
    width: int, height: int, gpu_counts: list[int], mig_counts: list[int] | None = None
) -> Layout:
    """The layout for a `width` x `height` terminal showing sections of `gpu_counts` GPUs
    (and `mig_counts` MIG devices, a line each under their GPU)."""
    migs = mig_counts or [0] * len(gpu_counts)
    widest = max(gpu_counts, default=1) or 1
    columns = max(1, min(widest, width // MIN_CARD_WIDTH))
    # The panel's padding (2) and scroll bar (1) take 3 cells; CARD_GAP separates cards.
    card_width = max(20, (width - 3 - len(CARD_GAP) * (columns - 1)) // columns)
    budget = max(3, height - CHROME_LINES - max(MIN_TABLE_LINES, height * 2 // 5))
    graph_choices = (2, 1) if card_width >= GRAPH_MIN_CARD_WIDTH else ()
    for graph_rows in (*graph_choices, 0):
        needed = _needed(gpu_counts, columns, graph_rows) + _mig_lines(migs, columns)
        if needed <= budget:
            return Layout(columns, card_width, graph_rows, needed)
    needed = _needed(gpu_counts, columns, 0, compact=True) + _mig_lines(migs, columns)
    return Layout(columns, card_width, 0, min(needed, budget), compact=True)


def _mig_lines(mig_counts: list[int], columns: int) -> int:
    """A MIG line lengthens its card; cards side by side share the longest."""
    return sum(math.ceil(count / columns) for count in mig_counts)


def _needed(gpu_counts: list[int], columns: int, graph_rows: int, *, compact: bool = False) -> int:
    """Lines for every section: a header line, then rows of cards."""
    per_card = card_lines(graph_rows, compact=compact)
    return sum(1 + math.ceil(max(count, 1) / columns) * per_card for count in gpu_counts)
