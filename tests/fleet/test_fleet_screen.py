"""`gpuwatch fleet`'s screen: keys through a Pilot, and screenshots compared with accepted SVGs.

The clock is frozen and the fleet simulated, so a difference in a screenshot is a change
in what users see. After a deliberate change, review and accept the new pictures with
`pytest tests/fleet/test_fleet_screen.py --snapshot-update`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import msgspec
import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.errors import SourceError
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.tui.common.section import GRAPH_WINDOW_S
from gpuwatch.tui.fleet.app import FleetApp
from gpuwatch.tui.fleet.cells import cell_text
from gpuwatch.tui.fleet.screens import NodeScreen, UsersScreen
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.prometheus import Prometheus, StartDaemons, StartPrometheus, Target
from tests.helpers.tui import synced, until
from tests.helpers.wait import wait_until

SnapCompare = Callable[..., bool]


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clock times on screen are local: pin the zone so every machine draws the same."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def frozen_app(nodes: int = 20) -> FleetApp:
    """A simulated fleet at a frozen moment, fed by hand: no reader thread."""
    return FleetApp(
        SimFleet(nodes, clock=lambda: FROZEN_TIME), sample=False, monotonic=lambda: 1000.0
    )


async def first_read(pilot: Pilot[int]) -> None:
    app = pilot.app
    assert isinstance(app, FleetApp)
    app.feed(app.source.read())
    await pilot.pause()


def shown(app: FleetApp) -> list[str]:
    return list(app.table().order)


# --- keys -----------------------------------------------------------------------------------


@synced
async def test_sort_keys_change_the_order_and_reverse_it() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await first_read(pilot)
        # GIVEN the default order: most free GPUs first
        assert app.view.sort_column == "free" and len(shown(app)) == 20
        # WHEN s is pressed THEN the next column sorts, highest first
        await pilot.press("s")
        assert app.view.sort_column == "most_free"
        free = [app.table().row(k).most_free_bytes or -1 for k in shown(app)]
        assert free == sorted(free, reverse=True)
        # WHEN r is pressed THEN the order turns around
        before = shown(app)
        await pilot.press("r")
        assert shown(app) != before and not app.view.sort_reverse


@synced
async def test_the_filter_keeps_matching_nodes_and_esc_brings_all_back() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await first_read(pilot)
        # WHEN / and `down` are typed THEN only nodes down or stale are shown
        await pilot.press("slash", *"down", "enter")
        assert sorted(shown(app)) == ["node-06", "node-09", "node-19"]
        assert "filter: down  (3 of 20 nodes)" in app.view.status(3, 20)
        # WHEN Esc is pressed THEN every node is back
        await pilot.press("escape")
        assert len(shown(app)) == 20


@synced
async def test_a_filter_typed_applies_on_enter_and_the_sort_stays() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await first_read(pilot)
        # GIVEN the nodes sorted by name, last first
        await pilot.click("#nodes", offset=(3, 0))
        await pilot.press("r")
        assert shown(app) == sorted(shown(app), reverse=True)
        every = shown(app)
        # WHEN a filter is typed THEN the table stays as it was until Enter
        await pilot.press("slash", *"down")
        assert shown(app) == every and app.view.filter_text == ""
        # WHEN Enter is pressed THEN it applies, in the order chosen
        await pilot.press("enter")
        assert shown(app) == ["node-19", "node-09", "node-06"]
        assert "filter: down  (3 of 20 nodes)" in str(app.query_one("#status", Static).render())


@synced
async def test_enter_shows_the_nodes_gpus_with_graphs_from_the_sources_history() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await first_read(pilot)
        first = shown(app)[0]
        # WHEN Enter is pressed on the first node
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen) and screen.node == first
        # THEN its history arrives and fills its cards' graphs, not just this screen's read
        await until(pilot, lambda: screen.section.frame is not None, "the node's first read")
        trend = next(iter(screen.section.trends.values()))
        assert len(trend.utilization) > 100
        assert screen.section.history_note == "from simulated (20 nodes)"
        # AND Esc goes back to the table
        await pilot.press("escape")
        assert not isinstance(app.screen, NodeScreen)


@synced
async def test_u_shows_the_users_and_u_again_the_nodes() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await first_read(pilot)
        await pilot.press("u")
        assert isinstance(app.screen, UsersScreen)
        await pilot.press("u")
        assert not isinstance(app.screen, UsersScreen)


@synced
async def test_q_quits_with_status_zero() -> None:
    app = frozen_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await first_read(pilot)
        await pilot.press("q")
    assert app.return_code == 0


@synced
async def test_a_thousand_nodes_are_a_thousand_rows() -> None:
    app = frozen_app(1000)
    async with app.run_test(size=(80, 24)) as pilot:
        await first_read(pilot)
        assert app.table().row_count == 1000
        # AND a second read updates them in place: the same rows, the same order
        order = shown(app)
        app.feed(app.source.read())
        await pilot.pause()
        assert shown(app) == order


def drawn_lines(app: FleetApp) -> list[str]:
    table = app.table()
    return [table.render_line(y).text for y in range(table.size.height)]


@synced
async def test_a_read_that_changes_one_node_redraws_that_row_and_keeps_the_others() -> None:
    app = frozen_app(20)
    async with app.run_test(size=(100, 30)) as pilot:
        # GIVEN the fleet on screen, the cursor on the second row
        await first_read(pilot)
        await pilot.press("down")
        await pilot.pause()
        fleet = app.source.read()
        order = shown(app)
        changed = order[1]
        before = drawn_lines(app)
        # WHEN a read finds that node's data 400 s old (still up) and nothing else new
        nodes = tuple(
            msgspec.structs.replace(node, data_at=fleet.taken_at - 400.0)
            if node.name == changed
            else node
            for node in fleet.nodes
        )
        app.feed(msgspec.structs.replace(fleet, nodes=nodes))
        await pilot.pause()
        after = drawn_lines(app)
        # THEN its row shows the new age, the other rows are drawn as before,
        # and the cursor stays on it
        assert shown(app) == order
        row_lines = {i for i, line in enumerate(after) if changed in line}
        assert row_lines and all("6m" in after[i] for i in row_lines)
        assert all(after[i] == before[i] for i in range(len(after)) if i not in row_lines)
        assert app.selected_node() == changed


@synced
async def test_rows_far_below_the_screen_show_their_nodes_once_scrolled_to() -> None:
    app = frozen_app(1000)
    async with app.run_test(size=(80, 24)) as pilot:
        # GIVEN a thousand nodes, the first rows on screen
        await first_read(pilot)
        last, before_last = shown(app)[-1], shown(app)[-2]
        assert not any(last in line for line in drawn_lines(app))
        # WHEN End is pressed
        await pilot.press("end")
        await pilot.pause()
        # THEN the last rows show every cell of their nodes, the cursor's row too
        lines = drawn_lines(app)
        table = app.table()
        for node in (last, before_last):
            line = next(line for line in lines if node in line)
            row = table.row(node)
            assert row is not None
            assert app.fleet is not None
            now = app.fleet.taken_at
            cells = [cell_text(row, column.key, now)[0] for column in table.columns_shown]
            assert line.split() == " ".join(cells).split(), line
        assert app.selected_node() == last


def reads_a_minute_apart() -> tuple[SimFleet, FleetState, FleetState]:
    """A fleet of 200 nodes, read twice a minute apart (its figures moved)."""
    now = [FROZEN_TIME]
    sim = SimFleet(200, clock=lambda: now[0])
    first = sim.read()
    now[0] += 60
    return sim, first, sim.read()


async def drawn_after(sim: SimFleet, reads: list[FleetState], *, scrolled_first: bool) -> list[str]:
    """The table's lines once `reads` are fed in turn, scrolled to the bottom after the
    first read or after the last."""
    app = FleetApp(sim, sample=False, monotonic=lambda: 1000.0)
    async with app.run_test(size=(100, 30)) as pilot:
        app.feed(reads[0])
        await pilot.pause()
        if scrolled_first:
            await pilot.press("end")
        for fleet in reads[1:]:
            app.feed(fleet)
            await pilot.pause()
        if not scrolled_first:
            await pilot.press("end")
            await pilot.pause()
        return drawn_lines(app)


@synced
async def test_a_table_drawn_through_many_reads_shows_what_one_drawn_once_does() -> None:
    # GIVEN two reads of a fleet, a minute apart, the screen scrolled to the bottom
    sim, first, second = reads_a_minute_apart()
    # WHEN one screen is fed them four times in turn and another the last alone
    many = await drawn_after(sim, [first, second, first, second], scrolled_first=True)
    once = await drawn_after(sim, [second], scrolled_first=True)
    # THEN the screen fed four reads draws the last one as the screen fed it alone
    assert many == once


@synced
async def test_rows_off_screen_through_reads_show_the_last_read_once_scrolled_to() -> None:
    # GIVEN two reads of a fleet a minute apart, the second fed while the screen shows
    # the first rows only
    sim, first, second = reads_a_minute_apart()
    # WHEN the screen scrolls to the rows it did not show at that read
    scrolled_late = await drawn_after(sim, [first, second], scrolled_first=False)
    # THEN they show the last read, as on a screen fed it alone
    assert scrolled_late == await drawn_after(sim, [second], scrolled_first=False)


def past_points(prometheus: Prometheus) -> int:
    """How many points of its past Prometheus gives the node with the fewest, at the step
    a node's graphs ask for (`PrometheusSource.history`)."""
    now = time.time()
    data = prometheus.api(
        "/api/v1/query_range",
        query="up",
        start=str(now - GRAPH_WINDOW_S),
        end=str(now),
        step=str(max(1.0, GRAPH_WINDOW_S / 240)),
    )
    return min((len(series["values"]) for series in data["result"]), default=0)


class FailingSource:
    """A Prometheus that stopped answering after its first read."""

    description = "prometheus http://prom:9090"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> FleetState:
        self.reads += 1
        if self.reads == 1:
            return SimFleet(3, clock=lambda: FROZEN_TIME).read()
        raise SourceError("prometheus http://prom:9090: connection refused")

    def close(self) -> None:
        pass


@synced
async def test_a_source_that_fails_is_said_and_the_last_read_stays() -> None:
    # GIVEN a source read every 0.05 s that fails after its first read
    app = FleetApp(FailingSource(), interval_s=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        # THEN the error is shown, and the nodes of the last good read stay on screen
        await until(pilot, lambda: app.error is not None, "the error")
        assert "connection refused" in (app.error or "")
        assert len(shown(app)) == 3


# --- screenshots ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_fleet_table(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    assert snap_compare(frozen_app(), terminal_size=size, run_before=first_read)


def test_node_cards(snap_compare: SnapCompare) -> None:
    app = frozen_app()

    async def open_node(pilot: Pilot[int]) -> None:
        await first_read(pilot)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        await until(pilot, lambda: screen.section.frame is not None, "the node's first read")
        app.redraw()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 40), run_before=open_node)


def test_users_view(snap_compare: SnapCompare) -> None:
    async def open_users(pilot: Pilot[int]) -> None:
        await first_read(pilot)
        await pilot.press("u")
        await pilot.pause()

    assert snap_compare(frozen_app(), terminal_size=(80, 24), run_before=open_users)


def test_the_guides_key_table_lists_every_key() -> None:
    from pathlib import Path

    from gpuwatch.tui.fleet.keys import FLEET_KEYS

    guide = Path(__file__).resolve().parents[2] / "docs" / "guide" / "fleet-screen.md"
    table = guide.read_text().split("| key | does |", 1)[1].split("\n\n", 1)[0]
    for key in FLEET_KEYS:
        for shown in key.shown.split():
            assert f"`{shown}`" in table, f"the guide's key table lacks {shown}"


@synced
async def test_question_mark_lists_the_keys_and_q_closes_the_list() -> None:
    app = frozen_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await first_read(pilot)
        await pilot.press("question_mark")
        assert app.screen.id == "help"
        await pilot.press("q")
        assert app.screen.id != "help" and app.is_running


# --- a real Prometheus ----------------------------------------------------------------------


def test_through_prometheus_the_nodes_show_and_a_nodes_cards_have_its_gpus_and_past(
    start_daemons: StartDaemons, start_prometheus: StartPrometheus
) -> None:
    # GIVEN two real daemons scraped every second by a real Prometheus until it holds a past
    # of each (two points at the step the node's graphs ask for), read as the fleet command
    # reads them for its table: per-node figures
    daemons = start_daemons([SimNode("node-a", (0, 30 << 30)), SimNode("node-b", (0,))])
    prometheus = start_prometheus([Target(daemon.address) for daemon in daemons])
    prometheus.wait_until_up([daemon.address for daemon in daemons])
    wait_until(lambda: past_points(prometheus) >= 2, "two points of each node's past")
    app = FleetApp(PrometheusSource(prometheus.url, needs=Needs(per_node=True)), interval_s=1.0)

    def node_a() -> NodeState | None:
        return next((n for n in app.fleet.nodes if n.name == "node-a"), None) if app.fleet else None

    async def look() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            # WHEN the screen has read the fleet THEN each daemon is a node, up
            await until(pilot, lambda: len(app.rows()) == 2, "both nodes")
            assert sorted(row.node for row in app.rows() if row.up) == ["node-a", "node-b"]
            assert (node := node_a()) is not None and node.snapshot is None
            # WHEN Enter opens the first node THEN its GPUs are read and shown as cards,
            # and its graphs start with Prometheus's past
            await pilot.press("enter")
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            await until(pilot, lambda: screen.section.frame is not None, "the node's read")
            await until(
                pilot,
                lambda: screen.section.frame.snapshot is not None,
                "its GPUs, read one by one",
            )
            assert len(screen.section.frame.snapshot.gpus) == 2
            assert screen.section.history_note == f"from prometheus {prometheus.url}"
            trend = next(iter(screen.section.trends.values()))
            assert len(trend.utilization) > 1, "the past came from query_range"
            # WHEN Esc closes it THEN the fleet is read as figures again
            await pilot.press("escape")
            await until(
                pilot,
                lambda: (n := node_a()) is not None and n.snapshot is None,
                "the node read as figures again",
            )

    asyncio.run(look())
