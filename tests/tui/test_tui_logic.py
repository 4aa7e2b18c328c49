"""`gpuwatch tui`, level 1: the pure logic under the screen (no Textual involved)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpuwatch.backends.auto import AutoBackend
from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.daemon_client import parse_series
from gpuwatch.backends.sim import SimBackend
from gpuwatch.errors import DriverNotFoundError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.tui.common import render
from gpuwatch.tui.common.layout import choose_layout
from gpuwatch.tui.common.trends import IdleClock, Series
from gpuwatch.tui.node import signals
from gpuwatch.tui.node.rows import BY_KEY, RowFilter, build_rows, cell_text, columns_for, sort_rows
from gpuwatch.tui.node.sources import LocalSource
from gpuwatch.tui.node.state import ScreenState
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.imports import HEAVY, loaded_after
from tests.helpers.tui import GIB, frame, gpu, lease, process, waiter


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [
        (10, [0.5, 0.1], [5, 1]),
        (10, [0.0, 0.0], [0, 0]),
        (10, [0.001, 0.0], [1, 0]),
        (20, [1.0, 0.0], [20, 0]),
        (7, [1 / 3, 1 / 3], [3, 2]),
    ],
    ids=["half-and-tenth", "empty", "sliver-gets-a-cell", "full", "thirds-round-to-total"],
)
def test_cells_split_a_bar_without_losing_or_inventing_cells(
    total: int, parts: list[float], expected: list[int]
) -> None:
    assert render.cells(total, parts) == expected


def test_memory_bar_shows_used_reserved_and_free_in_its_width() -> None:
    # GIVEN a GPU with 40 of 80 GiB used and 0.5 GiB reserved
    sample = gpu(0, used_gib=40)
    # WHEN its bar is drawn 20 cells wide
    spans = render.memory_bar(sample, 20)
    # THEN half is used, one cell reserved, the rest free, and nothing spills over
    assert [(len(text), style) for text, style in spans] == [
        (10, "ok"),
        (1, "reserved"),
        (9, "free"),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.1, "ok"), (0.85, "warn"), (0.97, "alarm"), (None, "dim")],
    ids=["low", "nearly-full", "full", "unknown"],
)
def test_memory_levels(value: float | None, expected: str) -> None:
    assert render.level(value, render.THRESHOLDS.memory) == expected


def test_sparkline_draws_levels_and_leaves_gaps_blank() -> None:
    assert render.sparkline([0.0, 0.5, 1.0, None]) == ["▁▄█ "]
    two_rows = render.sparkline([1.0, 0.25], height=2)
    assert two_rows == ["█ ", "█▄"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (125, "2m"),
        (3 * 3600 + 300, "3h05m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
        (None, "-"),
    ],
    ids=["seconds", "minutes", "hours", "days", "unknown"],
)
def test_durations_read_like_ps(seconds: float | None, text: str) -> None:
    assert render.duration(seconds) == text


@pytest.mark.parametrize(
    "hostile",
    ["evil\x1b[2J", "name\u202egnp.exe", "a\x00b", "x\x9bz"],
    ids=["escape", "bidi-override", "nul", "c1-control"],
)
def test_control_and_bidi_characters_never_reach_the_terminal(hostile: str) -> None:
    # GIVEN a process whose command and user carry characters a terminal acts on
    row = build_rows(
        frame([gpu(0)], [process(1, 0, command=hostile, user=hostile)]), {}, FROZEN_TIME, 600
    )[0]
    # WHEN its cells are drawn THEN each is printable, and marks where they were
    for key in ("command", "user"):
        shown = cell_text(row, BY_KEY[key], FROZEN_TIME, tagged=False)[0]
        assert all(ch.isprintable() for ch in shown)
        assert "?" in shown


def test_markup_in_a_command_is_shown_as_typed() -> None:
    # GIVEN a process whose command looks like Textual/Rich markup
    row = build_rows(
        frame([gpu(0)], [process(1, 0, command="[bold]x[/bold]")]), {}, FROZEN_TIME, 600
    )[0]
    # THEN its cell text is the literal command (cells are Text objects, never markup)
    assert cell_text(row, BY_KEY["command"], FROZEN_TIME, tagged=False)[0] == "[bold]x[/bold]"


def _rows():  # type: ignore[no-untyped-def]
    f = frame(
        [gpu(0), gpu(1)],
        [
            process(30, 0, user="bob", gib=1),
            process(10, 1, user="alice", gib=8),
            process(20, 0, user="carol", gib=8),
        ],
    )
    return build_rows(f, {}, FROZEN_TIME, 600)


@pytest.mark.parametrize(
    ("column", "reverse", "pids"),
    [
        ("gpu_mem", True, [20, 10, 30]),
        ("pid", False, [10, 20, 30]),
        ("user", False, [10, 30, 20]),
        ("gpu", False, [20, 30, 10]),
    ],
    ids=["memory-desc-ties-by-gpu", "pid", "user", "gpu-then-pid"],
)
def test_sort_by_any_column_with_a_stable_tie_break(
    column: str, reverse: bool, pids: list[int]
) -> None:
    ordered = sort_rows(_rows(), column, reverse=reverse)
    assert [r.pid for r in ordered] == pids


@pytest.mark.parametrize(
    ("text", "pids"),
    [
        ("user:bob", [30]),
        ("gpu:0", [20, 30]),
        ("gpu:0,1 user:alice", [10]),
        ("TRAIN", [10, 20, 30]),
        ("nothing-matches", []),
        ("", [10, 20, 30]),
    ],
    ids=["user", "one-gpu", "gpus-and-user", "word-any-case", "no-match", "empty"],
)
def test_filter_by_user_gpu_and_text(text: str, pids: list[int]) -> None:
    row_filter = RowFilter.parse(text)
    assert sorted(r.pid for r in _rows() if row_filter.matches(r)) == pids


def test_a_malformed_filter_term_is_reported_not_fatal() -> None:
    assert "gpu:x" in RowFilter.parse("gpu:x").problem


def test_idle_clock_counts_the_current_idle_stretch_only() -> None:
    # GIVEN a GPU busy at t=0..10, then idle from t=20
    clock = IdleClock()
    for t, util in [(0, 90), (10, 50), (20, 0), (30, 1), (40, 0)]:
        clock.observe(float(t), util)
    # THEN it has been idle for 30 s at t=50, exactly (it was seen busy before)
    idle = clock.idle_for(50.0)
    assert idle is not None and idle.seconds == 30 and not idle.at_least
    # AND a process started at t=35 has idled only since it started
    assert clock.idle_for(50.0, since=35.0).seconds == 15  # type: ignore[union-attr]
    # AND any busy sample ends the stretch
    clock.observe(60.0, 40)
    assert clock.idle_for(70.0) is None


def test_idle_since_the_first_sample_is_at_least_that_long() -> None:
    clock = IdleClock()
    clock.observe(100.0, 0)
    idle = clock.idle_for(400.0)
    assert idle is not None and idle.at_least and idle.seconds == 300


def test_idle_holders_are_marked_from_history_past_the_threshold() -> None:
    # GIVEN GPU 0 idle for 20 minutes of history, GPU 1 busy, a process on each
    state = ScreenState(["node1"], 1.0)
    start = FROZEN_TIME - 1200
    for step in range(0, 1201, 60):
        state.apply(
            0,
            frame(
                [gpu(0, util=0), gpu(1, util=80)],
                [process(1, 0), process(2, 1)],
                taken_at=start + step,
            ),
            float(step),
        )
    # WHEN the rows are built with a 10-minute threshold
    rows = {r.pid: r for r in state.rows(FROZEN_TIME, 1200.0, idle_after_s=600)}
    # THEN only the holder on the idle GPU is marked, for the whole observed stretch
    assert rows[1].idle is not None and rows[1].idle.seconds == 1200
    assert rows[2].idle is None
    # AND a longer threshold marks no one
    assert all(r.idle is None for r in state.rows(FROZEN_TIME, 1200.0, idle_after_s=3600))


def test_lease_column_names_the_holder_and_memory_declarations() -> None:
    # GIVEN pid 1 holds GPU 0 exclusively; carol's shared lease on GPU 1 has no process yet
    f = frame(
        [gpu(0), gpu(1)],
        [process(1, 0)],
        leases=[lease(0, 1), lease(1, 77, mem_gib=8)],
        waiters=[waiter(99)],
    )
    rows = {r.pid: r for r in build_rows(f, {}, FROZEN_TIME, 600)}
    # THEN the process row says it holds the lease, the lease shows as its own row,
    assert rows[1].lease == "holder (exclusive)"
    assert rows[77].kind == "lease" and rows[77].lease == "holder (--mem 8.0GiB)"
    # AND the waiting job is listed with what it wants
    assert rows[99].kind == "waiting" and rows[99].wants == "2 GPUs, ≥20.0GiB free"


def test_a_process_of_the_lease_holders_user_is_under_that_lease() -> None:
    # GIVEN carol's lease on GPU 0, held by her launcher (pid 1); her worker pid 5 runs there
    f = frame([gpu(0)], [process(5, 0, user="carol")], leases=[lease(0, 1, mem_gib=8)])
    # THEN the worker's row names her lease
    assert build_rows(f, {}, FROZEN_TIME, 600)[0].lease == "carol (8.0GiB)"


def test_another_users_process_on_a_leased_gpu_is_outside_the_lease() -> None:
    # GIVEN carol's lease on GPU 0, and alice's process there too
    f = frame([gpu(0)], [process(5, 0, user="alice")], leases=[lease(0, 1, mem_gib=8)])
    (row,) = [r for r in build_rows(f, {}, FROZEN_TIME, 600) if r.pid == 5]
    # THEN alice's row says it is outside carol's lease, in the warning colour
    assert row.lease == "outside carol's lease"
    assert cell_text(row, BY_KEY["lease"], FROZEN_TIME, False) == ("outside carol's lease", "warn")
    # AND a process whose owner cannot be seen is not said to be outside it
    unseen = frame([gpu(0)], [replace(process(5, 0), user=None)], leases=[lease(0, 1)])
    assert build_rows(unseen, {}, FROZEN_TIME, 600)[0].lease == "on carol's lease"
    # AND a GPU with no lease leaves the column empty
    free = frame([gpu(0)], [process(5, 0, user="alice")])
    assert build_rows(free, {}, FROZEN_TIME, 600)[0].lease == ""


@pytest.mark.parametrize(
    ("size", "gpus", "columns", "graph_rows"),
    [
        ((160, 48), 8, 2, 2),
        ((80, 24), 4, 1, 0),
        ((200, 60), 4, 2, 2),
        ((120, 40), 1, 1, 2),
    ],
    ids=["8-gpus-at-160x48-fit-with-graphs", "80x24-drops-graphs", "wide", "one-gpu"],
)
def test_layout_by_terminal_size(
    size: tuple[int, int], gpus: int, columns: int, graph_rows: int
) -> None:
    layout = choose_layout(*size, [gpus])
    assert (layout.card_columns, layout.graph_rows) == (columns, graph_rows)
    assert layout.gpu_panel_lines <= size[1] - 4 - 6, "the process table keeps room"


def test_narrow_screens_drop_columns_but_keep_who_and_what() -> None:
    wide = {c.key for c in columns_for(200, several_hosts=False)}
    narrow = {c.key for c in columns_for(80, several_hosts=False)}
    assert "lease" in wide and "host" not in wide
    assert {"gpu", "pid", "user", "gpu_mem", "command"} <= narrow < wide
    assert "host" in {c.key for c in columns_for(200, several_hosts=True)}


def test_series_buckets_average_within_each_slice() -> None:
    series = Series(100)
    for t in range(10):
        series.add(float(t), t / 10)
    assert series.buckets(0.0, 10.0, 2) == [pytest.approx(0.2), pytest.approx(0.7)]
    assert series.buckets(20.0, 30.0, 2) == [None, None]


@pytest.mark.parametrize(
    "item",
    [
        {"index": 0, "taken_at": [1.0], "memory_used_bytes": [1], "utilization_pct": []},
        {"index": -1, "taken_at": [], "memory_used_bytes": [], "utilization_pct": []},
        {"index": 0, "taken_at": [float("nan")], "memory_used_bytes": [1], "utilization_pct": [1]},
        {"index": 0, "taken_at": "x", "memory_used_bytes": [], "utilization_pct": []},
        ["not", "a", "dict"],
    ],
    ids=["ragged", "negative-index", "nan-time", "not-a-list", "not-a-dict"],
)
def test_malformed_daemon_history_is_skipped(item: object) -> None:
    assert parse_series(item) is None


def test_out_of_range_history_values_become_gaps() -> None:
    item = {
        "index": 0,
        "taken_at": [1.0, 2.0],
        "memory_used_bytes": [-5, 10],
        "utilization_pct": [101, True],
    }
    series = parse_series(item)
    assert series is not None
    assert series.memory_used_bytes == [None, 10] and series.utilization_pct == [None, None]


@pytest.mark.slow
def test_state_stays_bounded_over_an_hour_of_samples() -> None:
    # GIVEN a screen fed one frame a second for an hour, with processes coming and going
    state = ScreenState(["node1"], 1.0)
    for second in range(3600):
        pids = range(second % 50, second % 50 + 20)
        state.apply(
            0,
            frame(
                [gpu(i) for i in range(8)],
                [process(p, p % 8) for p in pids],
                taken_at=FROZEN_TIME + second,
            ),
            float(second),
        )
    # THEN only live processes keep series, and every series is capped
    assert len(state.process_trends) == 20
    section = state.sections[0]
    assert all(len(t.memory) <= 1200 for t in section.trends.values())


@pytest.mark.parametrize(
    "module",
    [
        "gpuwatch.tui.common.render",
        "gpuwatch.tui.node.rows",
        "gpuwatch.tui.common.section",
        "gpuwatch.tui.common.layout",
        "gpuwatch.tui.node.signals",
        "gpuwatch.tui.node.sources",
        "gpuwatch.tui.node.keys",
        "gpuwatch.tui.node.training",
        "gpuwatch.tui.node.sampler",
        "gpuwatch.tui.node.model",
        "gpuwatch.tui.common.cards",
        "gpuwatch.tui.common.view",
        "gpuwatch.tui.fleet.model",
        "gpuwatch.tui.fleet.node_cards",
    ],
)
def test_the_tui_logic_imports_no_textual(module: str) -> None:
    assert loaded_after(f"import {module}").isdisjoint(HEAVY)


def test_a_held_gpu_idle_past_the_threshold_says_so_on_its_card() -> None:
    # GIVEN GPU 0 held by a process and idle for 20 minutes; GPU 1 idle but unused
    state = ScreenState(["node1"], 1.0)
    for step in range(0, 1201, 60):
        taken_at = FROZEN_TIME - 1200 + step
        state.apply(
            0,
            frame([gpu(0, util=0), gpu(1, util=0, used_gib=0)], [process(1, 0)], taken_at=taken_at),
            taken_at,
        )
    section = state.sections[0]
    # THEN only the held one carries the note
    assert section.card_input(0, FROZEN_TIME, 80, idle_after_s=600).idle_note == "held, idle ≥20m"
    assert section.card_input(1, FROZEN_TIME, 80, idle_after_s=600).idle_note == ""
    assert section.card_input(0, FROZEN_TIME, 80, idle_after_s=3600).idle_note == ""


@pytest.mark.parametrize(
    ("my_uid", "target_uids", "allowed"),
    [
        (0, (1000, 1000), True),
        (1000, (1000, 1000), True),
        (1000, (2000, 1000), True),
        (1000, (2000, 2000), False),
    ],
    ids=["root", "own", "saved-uid-is-ours", "someone-else"],
)
def test_who_may_signal_follows_the_kernel(
    my_uid: int, target_uids: tuple[int, int], allowed: bool
) -> None:
    assert signals.may_signal(my_uid, target_uids) is allowed


def test_the_plan_leaves_out_what_cannot_be_signalled_and_says_why() -> None:
    # GIVEN a process of root's (pid 1), one on another machine, and one that does not exist
    rows = build_rows(frame([gpu(0)], [process(1, 0), process(4_000_000, 0)]), {}, FROZEN_TIME, 0)
    remote = build_rows(frame([gpu(0)], [process(os.getpid(), 0)], source="node9"), {}, 0, 0)
    remote = [replace(r, local=False) for r in remote]
    # WHEN an ordinary user plans to signal them all
    plan = signals.plan([*rows, *remote], my_uid=12345)
    # THEN none is offered, each with its reason, and no root warning is due
    assert plan.targets == () and not plan.as_root
    reasons = " | ".join(plan.refused)
    assert "pid 1: belongs to " in reasons
    assert "no such process here" in reasons
    assert "on node9, not on this machine" in reasons


def test_a_process_listed_twice_for_one_gpu_is_one_row_and_one_on_two_gpus_is_two() -> None:
    f = frame([gpu(0), gpu(1)], [process(5, 0), process(5, 0), process(5, 1)])
    rows = build_rows(f, {}, FROZEN_TIME, 600)
    assert sorted(r.device for r in rows) == ["0", "1"]
    assert len({r.key for r in rows}) == 2


_maybe_int = st.one_of(st.none(), st.integers(min_value=-(1 << 40), max_value=1 << 50))
_maybe_float = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    total=_maybe_int,
    used=_maybe_int,
    reserved=_maybe_int,
    util=st.one_of(st.none(), st.integers(min_value=-5, max_value=500)),
    temperature=st.one_of(st.none(), st.integers(min_value=-300, max_value=3000)),
    power=_maybe_float,
    limit=_maybe_float,
    name=st.text(max_size=80),
    width=st.integers(min_value=20, max_value=200),
    graph=st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=300),
)
def test_a_card_never_fails_or_overflows_whatever_the_gpu_reports(
    total: int | None,
    used: int | None,
    reserved: int | None,
    util: int | None,
    temperature: int | None,
    power: float | None,
    limit: float | None,
    name: str,
    width: int,
    graph: list[float | None],
) -> None:
    # GIVEN any values a driver (or a forged snapshot) could report
    sample = GpuSample(
        index=0,
        uuid=None,
        name=name,
        pci_bus_id=None,
        memory_total_bytes=total,
        memory_used_bytes=used,
        memory_reserved_bytes=reserved,
        utilization_pct=util,
        temperature_c=temperature,
        power_w=power,
        power_limit_w=limit,
    )
    # WHEN its card is drawn THEN it draws, no line is wider than the card, and nothing
    # unprintable gets through
    for line in render.gpu_card(sample, render.CardInput(graph, graph), width, 2):
        text = "".join(part for part, _ in line)
        assert len(text) <= width
        assert all(ch.isprintable() for ch in text)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(min_value=0, max_value=300),
    parts=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4),
)
def test_cells_never_exceed_the_bar(total: int, parts: list[float]) -> None:
    counts = render.cells(total, parts)
    assert len(counts) == len(parts) and all(c >= 0 for c in counts) and sum(counts) <= total


def test_the_tree_puts_ranks_under_their_launcher_and_starts_where_it_branches() -> None:
    # GIVEN two ranks started by torchrun (from a shell under sshd), and an unrelated job
    from gpuwatch.tui.common.frames import Ancestor
    from gpuwatch.tui.node.tree import tree_order

    ancestors = {
        a.pid: a
        for a in [
            Ancestor(10, 1, "root", "sshd"),
            Ancestor(50, 10, "alice", "bash"),
            Ancestor(100, 50, "alice", "torchrun"),
            Ancestor(101, 100, "alice", "python"),
            Ancestor(102, 100, "alice", "python"),
            Ancestor(200, 1, "bob", "python"),
        ]
    }
    f = frame(
        [gpu(0), gpu(1)], [process(101, 0, gib=9), process(200, 1, gib=5), process(102, 1, gib=1)]
    )
    rows = sort_rows(build_rows(f, {}, FROZEN_TIME, 600), "gpu_mem", reverse=True)
    # WHEN laid out as a tree
    tree = tree_order(rows, ancestors, "node1")
    # THEN torchrun heads its ranks (sshd and bash above it are left out), biggest first
    drawn = [(r.pid, r.kind, r.branch) for r in tree]
    assert drawn == [
        (100, "parent", ""),
        (101, "compute", "├─ "),
        (102, "compute", "└─ "),
        (200, "compute", ""),
    ]
    assert cell_text(tree[2], BY_KEY["command"], FROZEN_TIME, tagged=False)[0].startswith("└─ ")


def test_a_forged_parent_loop_still_ends() -> None:
    from gpuwatch.tui.common.frames import Ancestor
    from gpuwatch.tui.node.tree import tree_order

    ancestors = {7: Ancestor(7, 8, None, "a"), 8: Ancestor(8, 7, None, "b")}
    rows = build_rows(frame([gpu(0)], [process(7, 0)]), {}, FROZEN_TIME, 600)
    assert [r.pid for r in tree_order(rows, ancestors, "node1") if r.kind != "parent"] == [7]


def test_ancestors_are_read_from_proc_up_to_init() -> None:
    from gpuwatch.tui.node.sources import read_ancestors

    found = {a.pid: a for a in read_ancestors({os.getpid()})}
    assert found[os.getpid()].ppid == os.getppid()
    assert all(pid > 1 for pid in found)


def test_graphs_keep_drawing_after_the_wall_clock_steps_back_an_hour() -> None:
    # GIVEN a GPU sampled every 10 s for 10 minutes, the wall clock stepped back an hour halfway
    state = ScreenState(["node1"], 10.0)
    for second in range(0, 600, 10):
        wall = FROZEN_TIME + second - (3600 if second >= 300 else 0)
        state.apply(0, frame([gpu(0, util=80)], taken_at=wall), 5000.0 + second)
    # WHEN the graphs are drawn now
    memory, utilization = state.sections[0].graphs(0, 5600.0, 60)
    # THEN the samples after the step are there, up to the last cell
    assert all(value is not None for value in utilization[-25:])
    assert memory[-1] is not None


def test_a_gpu_idle_24_s_after_the_wall_clock_jumps_a_day_is_idle_24_s() -> None:
    # GIVEN a held GPU busy, then idle from monotonic 100 s, the wall clock a day ahead at 110 s
    state = ScreenState(["node1"], 1.0)
    for second in range(0, 125):
        jump = 86400 if second >= 110 else 0
        wall = FROZEN_TIME + second + jump
        holder = process(1, 0, started_at=FROZEN_TIME - 3600 + jump)  # /proc moves with it
        busy = 80 if second < 100 else 0
        state.apply(0, frame([gpu(0, util=busy)], [holder], taken_at=wall), float(second))
    section = state.sections[0]
    # THEN the card and the row count 24 s of idling, not a day
    assert section.card_input(0, 124.0, 80, idle_after_s=10).idle_note == "held, idle 24s"
    (row,) = state.rows(FROZEN_TIME + 124 + 86400, 124.0, idle_after_s=10)
    assert row.idle is not None and row.idle.seconds == 24 and not row.idle.at_least


def test_help_lines_too_long_go_on_under_their_description() -> None:
    # GIVEN the help at the width of an 80-column terminal's box
    from gpuwatch.tui.common.keys import HELP_WIDTH
    from gpuwatch.tui.node.keys import help_text

    text = "".join(part for part, _ in help_text(readonly=False, width=HELP_WIDTH))
    lines = text.splitlines()
    # THEN no line is wider than the box, and every continued line starts under the text
    assert max(len(line) for line in lines) <= HELP_WIDTH
    keys_part = lines[2 : lines.index("", 2)]
    continued = [line for line in keys_part if not line.startswith("  ") or line[2] == " "]
    assert continued, "some description is long enough to go on"
    assert all(line.startswith(" " * 26) and line[26] != " " for line in continued)
    # AND Tab, which moves to the GPU cards, is listed
    assert "Tab" in text


def test_every_column_title_has_room_for_the_sort_arrow() -> None:
    from gpuwatch.tui.node.rows import COLUMNS

    assert all(c.width >= len(c.title) + 2 for c in COLUMNS if c.key != "command")


def test_sizes_read_as_gpuwatch_status_writes_them() -> None:
    from gpuwatch.tui.common import render
    from gpuwatch.units import format_size

    for num_bytes in (1000 << 20, 512 << 20, int(61.5 * GIB), 3 << 40):
        assert render.size(num_bytes) == format_size(num_bytes)
    assert render.size(1000 << 20) == "1000.0MiB"


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_the_section_header_drops_whole_parts_never_cuts_one(width: int) -> None:
    from gpuwatch.tui.common.cards import fit_parts, header_parts

    state = ScreenState(["sim-node"], 1.0)
    state.apply(0, frame([gpu(0)], waiters=[waiter(9)], source="sim-node"), 0.0)
    parts = header_parts(state.sections[0], None, None, graphs=True)
    text = "".join(t for t, _ in fit_parts(parts, width))
    assert len(text) <= width
    wanted = [
        "sim-node",
        render.clock_time(FROZEN_TIME),
        "driver 580.95.05",
        "CUDA 13.0",
        "1 waiting for GPUs",
    ]
    wanted.append("graphs: 10 min from this screen's samples")
    shown = text.split("  ")
    assert all(piece in wanted for piece in shown)
    assert "sim-node" in shown and "1 waiting for GPUs" in shown


@pytest.mark.parametrize("width", [30, 80, 160])
@pytest.mark.parametrize("simulated", [True, False], ids=["simulated", "real"])
def test_the_section_header_says_simulated_however_narrow(width: int, simulated: bool) -> None:
    from gpuwatch.tui.common.cards import fit_parts, header_parts

    # GIVEN a frame of a simulated node, or of a real one
    real = frame([gpu(0)], source="node1")
    assert real.snapshot is not None
    state = ScreenState(["node1"], 1.0)
    state.apply(0, replace(real, snapshot=replace(real.snapshot, simulated=simulated)), 0.0)
    # WHEN its header is fitted to the screen
    parts = header_parts(state.sections[0], None, None, graphs=True)
    shown = "".join(t for t, _ in fit_parts(parts, width)).split("  ")
    # THEN a simulated node's says so, whatever else goes; a real node's never does
    assert ("simulated" in shown) is simulated
    assert shown[0] == "node1"


def test_a_lost_driver_says_its_error_once() -> None:
    from gpuwatch.tui.common.cards import header_parts, shared_error

    error = "NVML: driver/library version mismatch or GPU fallen off the bus (reboot needed)"
    gpus = [gpu(i, error=error) for i in range(4)]
    assert shared_error(gpus) == error
    assert shared_error([gpu(0, error=error), gpu(1)]) is None
    state = ScreenState(["node1"], 1.0)
    state.apply(0, frame(gpus), 0.0)
    header = "".join(
        t
        for _, spans in header_parts(state.sections[0], None, error, graphs=False)
        for t, _ in spans
    )
    assert header.count(error) == 1
    card = render.gpu_card(gpus[1], render.CardInput(error_above=True), 80, 0)
    text = "".join(t for line in card for t, _ in line)
    assert error not in text and text.count("see above") == 1


class DaemonWithHistory(SimBackend):
    """The daemon as the screen sees it: snapshots, and its history of each GPU."""

    name = "daemon"

    def history(self, window_s: float) -> list[GpuSeries]:
        times = [FROZEN_TIME - 600 + 10 * n for n in range(61)]
        return [GpuSeries(0, "GPU-0", times, [GIB] * 61, [40] * 61, [50] * 61, [200.0] * 61)]


class NoDriver(Backend):
    name = "nvml"

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        raise DriverNotFoundError("no driver here")

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("backend", "note"),
    [
        (lambda: DaemonWithHistory(1), "from the daemon's history (10 min)"),
        (lambda: AutoBackend(DaemonWithHistory(1), NoDriver), "from the daemon's history (10 min)"),
        (lambda: SimBackend(1), "from this screen's samples"),
    ],
    ids=["backend-daemon", "default-backend-over-the-daemon", "no-history-kept"],
)
def test_the_screen_starts_with_the_history_its_backend_keeps(
    backend: Callable[[], Backend], note: str
) -> None:
    # GIVEN a source over a backend that keeps a history (the daemon's, whether asked for
    # directly or behind the default backend) or none
    source = LocalSource(backend(), None, host_stats=None)
    # WHEN the screen asks for the past
    backfill = source.backfill()
    # THEN it gets the daemon's samples where there are some, and says where they come from
    assert backfill.note == note
    assert len(backfill.series) == (0 if "screen" in note else 1)
