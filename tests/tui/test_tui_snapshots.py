"""`gpuwatch tui`, level 3: screenshots of the main screens, compared with accepted SVGs.

The clock is frozen, the node simulated and the host figures fixed, so a
difference is a change in what users see. After a deliberate change, review
and accept the new pictures with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from textual.pilot import Pilot

from gpuwatch.backends.sim import SimBackend
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.sources import LocalSource
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import HOST, QuietSource, lease, slurm_jobs, waiter

SnapCompare = Callable[..., bool]


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clock times on screen are local: pin the zone so every machine draws the same."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def app_with_history(gpus: int, *, slurm: bool = False) -> GpuwatchApp:
    """A simulated node seen for the last ten minutes, one frame every 10 s; on a Slurm
    node (`slurm`), jobs hold GPUs 0-2 (tests/tui/test_tui_jobs.py's `slurm_jobs`)."""
    now = [FROZEN_TIME - 600]
    app = GpuwatchApp(
        [QuietSource("sim-node")],
        clock=lambda: FROZEN_TIME,
        monotonic=lambda: min(now[0], FROZEN_TIME),
        sample=False,
        as_root=False,
    )
    source = LocalSource(SimBackend(gpus, clock=lambda: now[0]), None, host_stats=lambda: HOST)

    async def feed(pilot: Pilot[int]) -> None:
        while now[0] <= FROZEN_TIME:
            frame = source.read()
            if slurm and frame.snapshot is not None:
                from msgspec.structs import replace

                uuids = [gpu.uuid for gpu in frame.snapshot.gpus]
                frame = replace(frame, jobs=slurm_jobs(uuids))
            if now[0] == FROZEN_TIME:
                from msgspec.structs import replace

                frame = replace(frame, leases=(lease(3, 40000),), waiters=(waiter(51000),))
            app.feed(0, frame)
            now[0] += 10
        await pilot.pause()

    app.run_before = feed  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize(
    ("size", "gpus"),
    [((80, 24), 4), ((160, 48), 8)],
    ids=["80x24-4-gpus", "160x48-8-gpus"],
)
def test_main_screen(snap_compare: SnapCompare, size: tuple[int, int], gpus: int) -> None:
    app = app_with_history(gpus)
    assert snap_compare(app, terminal_size=size, run_before=app.run_before)  # type: ignore[attr-defined]


def test_help_screen(snap_compare: SnapCompare) -> None:
    app = app_with_history(4)

    async def open_help(pilot: Pilot[int]) -> None:
        await app.run_before(pilot)  # type: ignore[attr-defined]
        await pilot.press("question_mark")

    assert snap_compare(app, terminal_size=(100, 30), run_before=open_help)


@pytest.mark.parametrize("size", [(80, 24), (120, 32)], ids=["80x24", "120x32"])
def test_slurm_node(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    # A JOB column, and each held GPU's card naming its job; GPU 1 allocated and idle
    app = app_with_history(4, slurm=True)
    assert snap_compare(app, terminal_size=size, run_before=app.run_before)  # type: ignore[attr-defined]
