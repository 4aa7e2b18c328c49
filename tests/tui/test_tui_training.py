"""The training panel of `gpuwatch tui`: pure lines, and the app showing a live report."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.reports.training import (
    MemoryPoint,
    ModuleMemory,
    ReportFile,
    TrainingReport,
    TrainingReports,
    reports_for_this_machine,
)
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.sources import LocalSource
from gpuwatch.tui.node.training import training_lines
from gpuwatch.tui.node.widgets import TrainingPanel
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import QuietSource
from tests.helpers.wait import wait_until_async

pytestmark = pytest.mark.timeout(120)
GIB = 1 << 30


def a_report(**changes: object) -> TrainingReport:
    values: dict[str, object] = {
        "pid": os.getpid(), "rank": 1, "world_size": 2, "hostname": "node", "device": "cuda:1",
        "step": 812, "published_at": FROZEN_TIME, "step_time_s": 0.25, "user": "alice",
        "allocated_bytes": 3 * GIB, "allocated_peak_bytes": 5 * GIB, "reserved_bytes": 6 * GIB,
        "inactive_split_bytes": GIB // 4, "alloc_retries": 2, "ooms": 0,
        "nvml_process_bytes": 7 * GIB, "modules_step": 810,
        "modules": (ModuleMemory("encoder.layers.0", GIB, 2 * GIB, None, None),),
        "recent": tuple(
            MemoryPoint(s, s * GIB // 10, 6 * GIB, 5 * GIB, GIB // 4) for s in range(20)
        ),
    }  # fmt: skip
    values.update(changes)
    return TrainingReport(**values)  # type: ignore[arg-type]


def test_the_lines_show_levels_modules_retries_and_ooms() -> None:
    text = "\n".join(training_lines(TrainingReports((a_report(),)), 160))
    assert f"pid {os.getpid()} rank 1/2 alice cuda:1 step 812" in text
    assert "alloc 3.0GiB resv 6.0GiB peak 5.0GiB frag 256.0MiB" in text
    assert "retries 2 OOMs 0" in text
    assert (
        "driver 7.0GiB ≥ reserved 6.0GiB ≥ allocated 3.0GiB  (context and libraries 1.0GiB)" in text
    )
    assert "encoder.layers.0 2.0GiB" in text


def test_a_cpu_run_shows_its_notice_and_skipped_files_are_counted() -> None:
    report = a_report(allocated_bytes=None, reserved_bytes=None, notice="a CPU build")
    text = "\n".join(training_lines(TrainingReports((report,), skipped=3), 160))
    assert "a CPU build" in text
    assert "3 report files passed over" in text


def test_lines_never_exceed_the_width() -> None:
    report = a_report(modules=tuple(ModuleMemory("m" * 150, 1, 2) for _ in range(4)))
    assert all(len(line) <= 60 for line in training_lines(TrainingReports((report,)), 60))


def test_the_app_shows_a_watched_training_and_hides_the_panel_without_one(
    lease_dir: Path,
) -> None:
    published = ReportFile()
    # The machine's source reads the reports (at most once a second) and its frames carry them.
    source = LocalSource(
        SimBackend(2, clock=lambda: FROZEN_TIME), None, None, training=reports_for_this_machine
    )
    app = GpuwatchApp(
        [QuietSource()], interval_s=0.1, clock=lambda: FROZEN_TIME, sample=False,
        panels=[TrainingPanel()],
    )  # fmt: skip

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            panel = app.query_one(TrainingPanel)

            async def frames_until(condition: Callable[[], bool], what: str) -> None:
                """Feeds a frame every 50 ms (each with the latest reports) until `condition`."""

                def fed() -> bool:
                    app.feed(0, source.read())
                    return condition()

                await wait_until_async(fed, what, pause=pilot.pause, timeout_s=60, interval_s=0.05)

            # GIVEN no training on the machine: after a read, the panel stays hidden
            await frames_until(lambda: app.state.sections[0].frame is not None, "a read")
            assert panel.display is False
            # WHEN a training publishes, THEN the panel shows it
            published.publish(a_report())
            await frames_until(lambda: panel.display, "the panel")
            assert "rank 1/2" in str(panel.render())
            assert "driver 7.0GiB ≥ reserved 6.0GiB ≥ allocated 3.0GiB" in str(panel.render())
            # WHEN the training ends, THEN the panel hides again
            published.close()
            await frames_until(lambda: not panel.display, "the panel to hide")

    asyncio.run(main())


def test_the_local_source_reads_training_at_most_once_a_second_and_survives_a_failure() -> None:
    calls: list[int] = []

    def reports() -> TrainingReports:
        calls.append(1)
        if len(calls) > 1:
            raise OSError("lease directory gone")
        return TrainingReports((a_report(),))

    source = LocalSource(SimBackend(2, clock=lambda: FROZEN_TIME), None, None, training=reports)
    # GIVEN two frames read straight after each other: one read, carried by both
    first, second = source.read(), source.read()
    assert len(calls) == 1
    assert first.training.reports == second.training.reports == (a_report(),)
    # WHEN the next read fails, THEN the frame carries no training, and no error
    source._training_read_at = None  # as if a second had passed
    assert source.read().training == TrainingReports()
    # AND a source told of no reports carries none
    assert LocalSource(SimBackend(1), None, None).read().training == TrainingReports()
