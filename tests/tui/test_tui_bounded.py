"""`gpuwatch tui` keeps no memory per refresh: what it holds follows the processes alive now.

A real machine's jobs come and go with new pids, so anything keyed by pid that is
never pruned grows for as long as the screen is open. Counts only, never times.
"""

from __future__ import annotations

import asyncio

import pytest

from gpuwatch.tui.node.app import GpuwatchApp
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import fed_app, frame, gpu, lease, process, waiter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LIVE = 12
"""Processes alive at any moment."""
REFRESHES = 150


def churning_frame(second: int) -> object:
    """Frame `second`: LIVE processes, one of which exited and was replaced by a new pid."""
    first = 1000 + second
    processes = [
        process(pid, pid % 4, command=f"python worker.py --id {pid}")
        for pid in range(first, first + LIVE)
    ]
    return frame(
        [gpu(index) for index in range(4)],
        processes,
        taken_at=FROZEN_TIME + second,
        leases=[lease(3, 500_000 + second)],  # a holder that uses no GPU memory yet
        waiters=[waiter(700_000 + second)],
    )


def held_counts(app: GpuwatchApp) -> dict[str, int]:
    table = app.table()
    return {
        "table rows": table.row_count,
        "rows the table keeps": len(table.rows),
        "rows known to the app": len(app.current_rows()),
        "process graphs": len(app.state.process_trends),
        "tagged": len(app.tagged),
    }


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "tree-view"])
def test_churning_pids_leave_nothing_behind_over_many_refreshes(tree: bool) -> None:
    app = fed_app()
    if tree:
        app.action_tree()
    seen: list[dict[str, int]] = []

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            # GIVEN a screen that has shown a few frames, with the first process tagged
            for second in range(5):
                app.feed(0, churning_frame(second))  # type: ignore[arg-type]
            await pilot.pause()
            app.view = app.view.toggle_tag(app.current_rows()[-1].key)
            # WHEN processes keep exiting and new pids keep appearing, refresh after refresh
            for second in range(5, REFRESHES):
                app.feed(0, churning_frame(second))  # type: ignore[arg-type]
                if second % 10 == 0:
                    await pilot.pause()
                    seen.append(held_counts(app))

    asyncio.run(main())
    # THEN every structure holds only what is alive: LIVE processes, a lease, a waiting job
    alive = LIVE + 2
    expected = {
        "table rows": alive,
        "rows the table keeps": alive,
        "rows known to the app": alive,
        "process graphs": LIVE,
        "tagged": 0,
    }
    assert seen and all(counts == expected for counts in seen), seen
