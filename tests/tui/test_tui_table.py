"""The one table widget (`gpuwatch.tui.common.table.RowTable`): it draws its rows' lines
itself, to keep what it drew; they must be the lines DataTable draws."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rich.segment import Segment
from textual.strip import Strip
from textual.widgets import DataTable

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.tui.common.app import TableApp
from gpuwatch.tui.common.table import RowTable
from gpuwatch.tui.fleet.app import FleetApp
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import fed_app, frame, gpu, lease, process, synced, waiter

Run = tuple[str, object, dict[str, object]]


def runs(strip: Strip) -> list[Run]:
    """What a line shows: its text, run by run, with each run's colours and attributes and
    the place it marks for the mouse."""
    merged: list[Run] = []
    for segment in strip:
        assert isinstance(segment, Segment) and segment.style is not None
        style = segment.style.clear_meta_and_links()
        meta = segment.style.meta
        if merged and merged[-1][1:] == (style, meta):
            merged[-1] = (merged[-1][0] + segment.text, style, meta)
        else:
            merged.append((segment.text, style, meta))
    return merged


def fleet() -> FleetApp:
    app = FleetApp(SimFleet(200, clock=lambda: FROZEN_TIME), sample=False, monotonic=lambda: 1e3)
    app.feed(app.source.read())
    return app


def node() -> TableApp[Any, Any]:
    app = fed_app()
    processes = [process(1000 + n, n % 4, gib=0.5 + n % 9, user=f"u{n % 5}") for n in range(80)]
    app.feed(
        0,
        frame(
            [gpu(i) for i in range(4)],
            processes,
            leases=[lease(3, 40000), lease(2, 1003, mem_gib=8)],
            waiters=[waiter(51000)],
        ),
    )
    return app


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("make", [fleet, node], ids=["fleet-table", "process-table"])
@synced
async def test_every_line_of_rows_is_drawn_as_datatable_draws_it(
    make: Callable[[], TableApp[Any, Any]], size: tuple[int, int]
) -> None:
    app = make()
    async with app.run_test(size=size) as pilot:
        app.redraw()
        await pilot.pause()
        table = app.table()
        moves = (((), False), (("down",) * 3, True), (("pagedown",) * 2, False), (("end",), False))
        for keys, mouse in moves:
            # GIVEN the table scrolled and its cursor moved (the first time: as it opens; at
            # the end, to rows added off screen), with the mouse over a row or not
            await pilot.press(*keys)
            if mouse:
                await pilot.hover(RowTable, offset=(3, 5))
            else:
                await pilot.hover("#title")
            await pilot.pause()
            assert table.mouse_hover == mouse
            # WHEN each line on screen is drawn by the table and by DataTable
            # THEN they are the same
            for y in range(table.size.height):
                assert runs(table.render_line(y)) == runs(DataTable.render_line(table, y)), y


@pytest.mark.parametrize(
    ("keys", "header"),
    [
        ((), "GPU-MEM ▼"),
        (("r",), "GPU-MEM ▲"),
        (("r", "s"), "SM% ▲"),
        (("r", "s", "S", "r"), "GPU-MEM ▼"),
    ],
    ids=["at-start", "reversed", "next-column", "back-and-reversed"],
)
@synced
async def test_the_drawn_header_shows_the_sort_even_where_the_rows_keep_their_order(
    keys: tuple[str, ...], header: str
) -> None:
    # GIVEN a table of one row, which no sort moves
    app = fed_app()
    async with app.run_test(size=(120, 30)) as pilot:
        app.feed(0, frame([gpu(0)], [process(1, 0)]))
        await pilot.pause()
        # WHEN the sort keys are pressed
        await pilot.press(*keys)
        await pilot.pause()
        # THEN the header as drawn puts the arrow on the sort column, in its direction
        drawn = app.table().render_line(0).text
        assert header in drawn and drawn.count("▲") + drawn.count("▼") == 1
