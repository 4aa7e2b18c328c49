"""The table's model (`gpuwatch.tui.node.model`): every transition, without a terminal."""

from __future__ import annotations

import pytest

from gpuwatch.tui.common.frames import Ancestor
from gpuwatch.tui.node.model import DEFAULT_SORT, TableView
from gpuwatch.tui.node.rows import Row, build_rows
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.imports import HEAVY, loaded_after
from tests.helpers.tui import frame, gpu, process


def rows() -> list[Row]:
    f = frame(
        [gpu(0), gpu(1)],
        [
            process(30, 0, user="bob", gib=1),
            process(10, 1, user="alice", gib=8),
            process(20, 0, user="carol", gib=8),
        ],
    )
    return build_rows(f, {}, FROZEN_TIME, 600)


def pids(view: TableView, **kwargs: object) -> list[int]:
    return [row.pid for row in view.arrange(rows(), **kwargs)]  # type: ignore[arg-type]


def test_the_model_loads_no_textual() -> None:
    assert not loaded_after("import gpuwatch.tui.node.model") & set(HEAVY)


def test_the_start_is_by_gpu_memory_largest_first() -> None:
    view = TableView()
    assert (view.sort_column, view.sort_reverse) == (DEFAULT_SORT, True)
    assert pids(view) == [20, 10, 30]


@pytest.mark.parametrize(
    ("clicks", "expected"),
    [
        (["pid"], ("pid", True)),
        (["pid", "pid"], ("pid", False)),
        (["pid", "user"], ("user", True)),
    ],
    ids=["new-column", "same-column-reverses", "another-column-keeps-direction"],
)
def test_a_header_click_sorts_by_it_or_reverses(
    clicks: list[str], expected: tuple[str, bool]
) -> None:
    view = TableView()
    for column in clicks:
        view = view.sort_by(column)
    assert (view.sort_column, view.sort_reverse) == expected


def test_sort_keys_cycle_over_the_shown_columns_but_host() -> None:
    shown = ["host", "gpu", "pid", "user"]
    # GIVEN a sort column not shown: the cycle starts from the first column shown
    view = TableView().cycle_sort(shown, 1)
    assert view.sort_column == "pid"
    assert view.cycle_sort(shown, 1).cycle_sort(shown, 1).sort_column == "gpu"  # wraps round
    assert view.cycle_sort(shown, -1).sort_column == "gpu"
    assert TableView().cycle_sort([], 1).sort_column == DEFAULT_SORT


def test_a_sort_column_no_longer_shown_falls_back() -> None:
    view = TableView(sort_column="sm")
    assert view.fit_columns(["pid", "gpu_mem"]).sort_column == DEFAULT_SORT
    assert view.fit_columns(["sm"]) is view


def test_the_sort_chosen_comes_back_when_its_column_is_shown_again() -> None:
    # GIVEN CPU% chosen, lowest first
    chosen = TableView().sort_by("cpu").reverse()
    assert (chosen.sort_column, chosen.sort_reverse) == ("cpu", False)
    # WHEN the terminal narrows so that CPU% is dropped, THEN the default order stands in
    narrow = chosen.fit_columns(["pid", "gpu_mem"])
    assert (narrow.sort_column, narrow.sort_reverse) == (DEFAULT_SORT, True)
    assert narrow.fit_columns(["pid", "gpu_mem"]) is narrow
    # AND when it widens again, the order chosen is back
    wide = narrow.fit_columns(["pid", "gpu_mem", "cpu"])
    assert (wide.sort_column, wide.sort_reverse) == ("cpu", False)
    assert wide.status().startswith("sorted by CPU% ▲")


def test_a_sort_chosen_while_narrow_replaces_the_one_dropped() -> None:
    # GIVEN CPU% chosen, then dropped by a narrow terminal
    narrow = TableView().sort_by("cpu").fit_columns(["pid", "gpu_mem"])
    # WHEN PID is chosen while narrow, THEN widening keeps PID
    chosen = narrow.sort_by("pid")
    assert chosen.fit_columns(["pid", "gpu_mem", "cpu"]).sort_column == "pid"
    # AND so does a reversal of the stand-in order: it is a choice too
    reversed_ = narrow.reverse()
    wide = reversed_.fit_columns(["pid", "gpu_mem", "cpu"])
    assert (wide.sort_column, wide.sort_reverse) == (DEFAULT_SORT, False)


def test_the_filter_keeps_its_text_and_its_problems() -> None:
    view = TableView().filter("user:bob gpu:x")
    assert pids(view) == [30]
    assert view.status() == (
        "sorted by GPU-MEM ▼  ·  filter: user:bob gpu:x  ·  not understood: gpu:x"
    )


def test_tags_toggle_and_outlive_no_row() -> None:
    view = TableView().toggle_tag("a").toggle_tag("b").toggle_tag("a")
    assert view.tagged == {"b"}
    # WHEN the tagged row is gone from the table, THEN so is its tag
    assert view.keep_tags(["c"]).tagged == frozenset()
    assert view.keep_tags(["b", "c"]) is view


def test_clear_drops_filter_tags_and_message_but_keeps_sort_and_tree() -> None:
    view = TableView().sort_by("pid").toggle_tree().filter("bob").toggle_tag("x").say("sent")
    cleared = view.clear()
    assert (cleared.filter_text, cleared.tagged, cleared.message) == ("", frozenset(), "")
    assert not cleared.row_filter
    assert (cleared.sort_column, cleared.tree) == ("pid", True)


def test_signal_targets_are_the_tagged_rows_else_the_selected_one() -> None:
    by_key = {row.key: row for row in rows()}
    some = next(iter(by_key.values()))
    assert TableView().targets(by_key, some) == [some]
    assert TableView().targets(by_key, None) == []
    tagged = TableView().toggle_tag(some.key).toggle_tag("gone")
    assert tagged.targets(by_key, None) == [some]


def test_the_tree_view_puts_children_under_their_parent() -> None:
    # GIVEN 30 and 10 children of a launcher 5 that uses no GPU, 20 on its own
    known = {
        30: Ancestor(30, 5, "bob", "python"),
        10: Ancestor(10, 5, "alice", "python"),
        5: Ancestor(5, 1, "bob", "torchrun"),
    }
    view = TableView().toggle_tree()
    arranged = view.arrange(rows(), [("node1", known)])
    # THEN the launcher gets a row, its children follow it, the tree sorts by its best row
    assert [row.pid for row in arranged] == [20, 5, 10, 30]
    assert arranged[1].kind == "parent"
    # AND without the tree view the ancestors change nothing
    assert pids(TableView(), ancestors=[("node1", known)]) == [20, 10, 30]


def test_the_status_line_says_everything_chosen() -> None:
    view = TableView().sort_by("pid").reverse().toggle_tree().toggle_tag("a").say("pid 7: sent")
    assert view.status() == "sorted by PID ▲  ·  tree view  ·  1 tagged  ·  pid 7: sent"


def test_selection_is_kept_only_when_it_changes() -> None:
    view = TableView().select("a")
    assert view.select("a") is view
    assert view.select("b").selected == "b"
