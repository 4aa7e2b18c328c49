"""`gpuwatch tui` at scale, across clock steps, and what each cell and key says (the app,
driven by a Pilot)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from textual.pilot import Pilot

from gpuwatch.tui.common.table import REMOVE_ONE_BY_ONE_MAX, RowTable
from gpuwatch.tui.node.app import GpuwatchApp
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import QuietSource, frame, gpu, process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def fed_app(**options: object) -> GpuwatchApp:
    return GpuwatchApp(
        [QuietSource()],
        clock=lambda: FROZEN_TIME,
        sample=False,
        as_root=False,
        **options,  # type: ignore[arg-type]
    )


def run(
    app: GpuwatchApp,
    body: Callable[[Pilot[int]], Awaitable[None]],
    size: tuple[int, int] = (160, 48),
) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await body(pilot)

    asyncio.run(main())


def many(count: int, *, first_pid: int = 1000) -> list:  # type: ignore[type-arg]
    return [process(first_pid + n, n % 2, gib=0.25 + (n % 7) / 8) for n in range(count)]


def test_a_mass_exit_empties_the_table_in_one_pass_and_keeps_the_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a table of many processes, one of them selected
    app = fed_app()
    removed: list[object] = []
    original = RowTable.remove_row

    def counting(table: RowTable, key: object) -> None:
        removed.append(key)
        original(table, key)  # type: ignore[arg-type]

    monkeypatch.setattr(RowTable, "remove_row", counting)
    survivor = process(99, 0, gib=50)
    crowd = many(10 * REMOVE_ONE_BY_ONE_MAX)

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(0), gpu(1)], [survivor, *crowd]))
        await pilot.pause()
        await pilot.press("down", "up")
        assert app.selected_row().pid == 99  # type: ignore[union-attr]
        # WHEN all but the selected one exit at once
        app.feed(0, frame([gpu(0), gpu(1)], [survivor]))
        await pilot.pause()
        table = app.table()
        # THEN the table holds just it, still selected, and no row was renumbered one by one
        assert table.row_count == 1
        assert app.selected_row().pid == 99  # type: ignore[union-attr]
        assert removed == []
        # AND a few exits are still removed in place
        app.feed(0, frame([gpu(0), gpu(1)], [survivor, *crowd[:3]]))
        await pilot.pause()
        app.feed(0, frame([gpu(0), gpu(1)], [survivor, *crowd[:1]]))
        await pilot.pause()
        assert table.row_count == 2 and len(removed) == 2

    run(app, body)


def test_a_filter_that_hides_thousands_and_brings_them_back_keeps_every_row() -> None:
    app = fed_app()
    crowd = many(2000)

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(0), gpu(1)], crowd))
        await pilot.pause()
        table = app.table()
        await pilot.press("slash", "z")
        assert table.row_count == 0
        await pilot.press("backspace", "enter")
        assert table.row_count == 2000
        assert app.current_rows()[0].key == str(table.coordinate_to_cell_key((0, 0)).row_key.value)

    run(app, body)


def test_the_screen_measures_idle_time_on_the_monotonic_clock() -> None:
    # GIVEN a screen whose wall clock jumps a day ahead while its GPU idles for 24 s
    times = {"wall": FROZEN_TIME, "monotonic": 100.0}
    app = GpuwatchApp(
        [QuietSource()],
        clock=lambda: times["wall"],
        monotonic=lambda: times["monotonic"],
        sample=False,
        as_root=False,
        idle_after_s=10,
    )

    async def body(pilot: Pilot[int]) -> None:
        for second in range(30):
            times["monotonic"] = 100.0 + second
            times["wall"] = FROZEN_TIME + second + (86400 if second > 10 else 0)
            busy = 90 if second < 5 else 0
            app.feed(0, frame([gpu(0, util=busy)], [process(1, 0)], taken_at=times["wall"]))
        await pilot.pause()
        # THEN the card says it has been idle 24 s, not a day
        cards = str(app.query_one("#section-0").render())
        assert "idle 24s" in cards and "1d" not in cards

    run(app, body)


def test_home_and_end_select_the_first_and_the_last_process() -> None:
    app = fed_app()

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(0), gpu(1)], many(60)))
        await pilot.pause()
        rows = app.current_rows()
        await pilot.press("end")
        assert app.selected_row() == rows[-1]
        await pilot.press("home")
        assert app.selected_row() == rows[0]

    run(app, body, size=(120, 30))


def test_8_gpus_at_80x24_all_show_without_scrolling() -> None:
    from gpuwatch.tui.common.widgets import SectionView

    app = fed_app()

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(i) for i in range(8)], many(4)))
        await pilot.pause()
        panel = app.query_one("#gpus")
        cards = str(app.query_one(SectionView).render())
        # THEN every card is on screen, and the panel has nothing below to scroll to
        assert all(f"[{i}] H100" in cards for i in range(8))
        assert panel.max_scroll_y == 0
        assert app.table().size.height >= 6

    run(app, body, size=(80, 24))


@pytest.mark.parametrize("reverse", [True, False], ids=["descending", "ascending"])
def test_the_sort_arrow_shows_both_ways(reverse: bool) -> None:
    app = fed_app()

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(0)], many(3)))
        await pilot.pause()
        if not reverse:
            await pilot.press("r")
        table = app.table()
        arrow = "▼" if reverse else "▲"
        label = table.columns["gpu_mem"].label  # type: ignore[index]
        assert str(label) == f"GPU-MEM {arrow}"
        assert table.columns["gpu_mem"].get_render_width(table) >= len(f"GPU-MEM {arrow}") + 2  # type: ignore[index]

    run(app, body, size=(80, 24))


def test_lease_text_is_readable_on_the_dark_theme() -> None:
    from textual.color import Color

    app = fed_app()

    async def body(pilot: Pilot[int]) -> None:
        app.theme = "textual-dark"
        app.feed(0, frame([gpu(0)], many(1)))
        await pilot.pause()
        table = app.table()
        colour = table.get_component_rich_style("span--lease").color
        assert colour is not None
        background = app.screen.styles.background
        assert contrast(Color.from_rich_color(colour), background) >= 4.5

    run(app, body)


def contrast(first: object, second: object) -> float:
    """The WCAG contrast ratio of two colours."""

    def luminance(colour: object) -> float:
        def channel(value: int) -> float:
            x = value / 255
            return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4

        r, g, b = colour.r, colour.g, colour.b  # type: ignore[attr-defined]
        return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)

    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_the_sm_column_shows_each_processs_share_and_sorts_by_it() -> None:
    from msgspec.structs import replace

    app = fed_app()
    busy = replace(process(1, 0, gib=2), sm_util_pct=97)
    idle = replace(process(2, 0, gib=9), sm_util_pct=0)
    in_mig = replace(process(3, 0, gib=5), sm_util_pct=None)

    async def body(pilot: Pilot[int]) -> None:
        app.feed(0, frame([gpu(0)], [busy, idle, in_mig]))
        await pilot.pause()
        table = app.table()
        column = table.get_column_index("sm")
        cells = {
            int(str(table.get_row_at(i)[table.get_column_index("pid")]).strip(" *")): str(
                table.get_row_at(i)[column]
            ).strip()
            for i in range(table.row_count)
        }
        # THEN the driver's figure shows, and "-" where it samples none
        assert cells == {1: "97", 2: "0", 3: "-"}
        # AND s reaches the column, sorting the busiest first
        while app.sort_column != "sm":
            await pilot.press("s")
        assert [r.pid for r in app.current_rows()] == [1, 2, 3]
        assert str(table.columns["sm"].label) == "SM% ▼"  # type: ignore[index]

    run(app, body)
