"""A table's columns: what each is called, how wide, how it sorts, which go first when
the terminal is narrow. Both tables (processes, nodes) are made of these.

Pure, and without Textual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Literal, TypeVar

import msgspec

R = TypeVar("R")

CELL_PADDING = 2
"""The table's padding around each cell (one cell each side)."""


class Column(Generic[R], msgspec.Struct, frozen=True):
    """One column of a table of rows of type `R`."""

    key: str
    title: str
    width: int
    sort_value: Callable[[R], object]
    drop_rank: int
    """Narrow screens drop columns with the highest rank first; 0 is never dropped."""
    justify: Literal["default", "left", "right"] = "default"
    """How its cells align: figures right, as in a spreadsheet ("default": as the text
    flows, with no padding drawn in the cell's style)."""


def sortable(value: float | None) -> float:
    """A figure to sort by, an unknown one (`None`) below every known one."""
    return -1.0 if value is None else value


def fitting(columns: Sequence[Column[R]], width: int, *, room_for: int) -> tuple[Column[R], ...]:
    """The `columns` that fit `width` cells with `room_for` cells to spare (what a column
    that takes the rest needs, and the scroll bar), dropping the least needed first."""
    chosen = list(columns)
    while sum(c.width + CELL_PADDING for c in chosen) + room_for > width:
        droppable = [c for c in chosen if c.drop_rank > 0]
        if not droppable:
            break
        chosen.remove(max(droppable, key=lambda c: c.drop_rank))
    return tuple(chosen)
