"""The fleet screen's view of the work around each node's GPUs: the jobs waiting in line for
them, the scheduler's job on each, and the GPUs a job holds but leaves idle."""

from __future__ import annotations

import asyncio
import json

from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.series import PREFIXES, target_state
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.tui.fleet.app import FleetApp
from gpuwatch.tui.fleet.cells import cell_text, plain_table
from gpuwatch.tui.fleet.model import FleetView
from gpuwatch.tui.fleet.rows import IdleTracker, build_rows, totals, user_rows
from gpuwatch.tui.fleet.screens import NodeScreen
from tests.helpers.cli import run_cli
from tests.helpers.fleet.servers import fixture

TAKEN_AT = 1.7954727494912333e09
NODE = fixture("gpuwatch_node.prom").decode()
WORK = NODE + fixture("gpuwatch_work.prom").decode()
TEN_MINUTES_S = 600.0


def scraped(text: str) -> NodeState:
    samples = list(parse_exposition(text, PREFIXES))
    now = TAKEN_AT + 1
    return target_state(samples, fallback_name="x", seen_at=now, now=now, stale_after_s=15)


def fleet_of(*texts: str) -> FleetState:
    nodes = tuple(sorted((scraped(text) for text in texts), key=lambda node: node.name))
    return FleetState(TAKEN_AT + 1, "test", nodes)


def cells(node: NodeState, idle_after_s: float = TEN_MINUTES_S) -> dict[str, tuple[str, str]]:
    (row,) = build_rows(FleetState(0.0, "test", (node,)), None, idle_after_s)
    return {key: cell_text(row, key, 0.0) for key in ("leases", "wait", "jobs", "idle")}


def test_a_node_row_says_its_leases_its_line_and_its_jobs() -> None:
    # GIVEN a node with 4 leases, 3 jobs in line (the oldest for 95s) and 2 Slurm jobs,
    # one of which its daemon says has left its GPU idle for half an hour
    shown = cells(scraped(WORK))
    # THEN the row says each, and marks the jobs: one of them wastes a GPU
    assert shown["leases"] == ("4+3w", "warn")
    assert shown["wait"] == ("1m", "warn")
    assert shown["jobs"] == ("2!", "warn")
    # AND the idle job's GPU is an idle holder, by the daemon's count
    assert shown["idle"][0] == "1"


def test_where_the_exporter_tells_no_line_or_jobs_the_row_says_unknown() -> None:
    gpuwatch_before = cells(scraped(NODE))
    assert (gpuwatch_before["leases"][0], gpuwatch_before["wait"], gpuwatch_before["jobs"]) == (
        "4",
        ("?", "dim"),
        ("?", "dim"),
    )
    dcgm = cells(scraped(fixture("dcgm_node.prom").decode()))
    assert [dcgm[key][0] for key in ("leases", "wait", "jobs")] == ["?", "?", "?"]


def test_a_job_idle_for_less_than_the_limit_is_not_marked() -> None:
    # GIVEN the same node, judged with an idle limit of an hour
    shown = cells(scraped(WORK), idle_after_s=3600.0)
    # THEN its jobs are counted, unmarked, and no GPU is an idle holder
    assert shown["jobs"] == ("2", "")
    assert shown["idle"][0] == "0"


def test_the_daemons_count_makes_an_idle_holder_before_the_screen_watched_that_long() -> None:
    # GIVEN a screen that has seen the node once
    fleet = fleet_of(WORK)
    tracker = IdleTracker()
    tracker.observe(fleet, now=100.0)
    # WHEN its rows are built with a ten-minute limit
    (row,) = build_rows(fleet, tracker.idle_for, TEN_MINUTES_S)
    # THEN the GPU the daemon has seen idle for half an hour counts already
    assert (row.idle_allocated, row.idle_held, row.jobs) == (1, 1, 2)


def test_users_count_their_jobs_and_the_gpus_their_jobs_hold() -> None:
    rows, _, _ = user_rows(fleet_of(WORK))
    by_user = {row.user: row for row in rows}
    # carol runs no process: her job holds GPU 0 and she is a user of the fleet all the same
    carol = by_user["carol"]
    assert (carol.gpus, carol.jobs, carol.memory_bytes) == (1, 1, 0)
    # alice's process runs inside her job, on the same GPU: one GPU, one job
    assert (by_user["alice"].gpus, by_user["alice"].jobs) == (1, 1)
    assert by_user["bob"].jobs == 0


def test_the_filter_finds_the_node_of_a_users_job() -> None:
    rows = build_rows(fleet_of(WORK))
    assert [row.node for row in FleetView().filter("user:carol").arrange(rows)] == ["gpu-node-07"]


def test_at_80_columns_the_plain_table_keeps_leases_and_jobs() -> None:
    rows = build_rows(fleet_of(WORK), None, TEN_MINUTES_S)
    _, titles, line = plain_table(rows, totals(rows), 80, TAKEN_AT + 1)
    assert "LEASES" in titles and "JOBS" in titles and "WAIT" not in titles
    assert "4+3w" in line.split()
    wide = plain_table(rows, totals(rows), 160, TAKEN_AT + 1)
    assert "WAIT" in wide[1]


class OneNode:
    description = "one node"

    def read(self) -> FleetState:
        return fleet_of(WORK)

    def close(self) -> None:
        pass


def test_a_nodes_cards_name_the_job_on_each_gpu_and_how_long_it_left_it_idle() -> None:
    app = FleetApp(OneNode(), sample=False, monotonic=lambda: 1000.0)

    async def look() -> None:
        async with app.run_test(size=(100, 40)) as pilot:
            app.feed(app.source.read())
            await pilot.pause()
            # WHEN Enter opens the node
            await pilot.press("enter")
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            section = screen.section
            # THEN each GPU a job holds names it on its card, with the idle time past the limit
            cards = [section.card_input(i, 1000.0, 100, TEN_MINUTES_S) for i in range(4)]
            notes = [card.idle_note for card in cards]
            assert notes == ["job 4242 carol, idle 30m", "job 4243_7 alice", "", ""]

    asyncio.run(look())


def test_the_json_of_a_simulated_fleet_tells_waiting_jobs_and_jobs_null_where_unknown() -> None:
    result = run_cli("fleet", "--sim", "20", "--json")
    assert result.exit_code == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    gpuwatch_nodes = [n for n in nodes if n["exporter"] == "gpuwatch" and n["gpus"]]
    dcgm = [n for n in nodes if n["exporter"] == "dcgm"]
    # THEN a gpuwatch node tells its line, and the job on each GPU a job holds
    assert all(isinstance(n["lease_waiters"], int) and n["jobs_known"] for n in gpuwatch_nodes)
    assert any(n["lease_waiters"] for n in gpuwatch_nodes)
    held = [g for n in gpuwatch_nodes for g in n["gpus"] if g["job_id"] is not None]
    assert held and all(g["job_user"] and g["allocated_idle_s"] is not None for g in held)
    # AND a dcgm-exporter node says neither: null, and its jobs are not known
    assert dcgm and all(n["lease_waiters"] is None and not n["jobs_known"] for n in dcgm)
