"""A job's use of one GPU from its history: mean, peak, idle time, and what the history
does not cover (it starts after the job, it has gaps, it holds nothing)."""

from __future__ import annotations

import msgspec
import pytest

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.reports.job_gpu_report import about, gpu_job_usage, shortfalls

START_S = 1_000_000.0


def series(times: list[float], util: list[int | None], memory: list[int | None]) -> GpuSeries:
    n = len(times)
    return GpuSeries(3, "GPU-x", times, memory, util, [None] * n, [None] * n)


def test_a_fully_sampled_job_gets_mean_peak_and_idle_time() -> None:
    # GIVEN a job of 10 s sampled every second: 4 s idle (<= 1 %), then 3 s at 50 %, 3 s at 100 %
    times = [START_S + i for i in range(10)]
    util: list[int | None] = [0, 1, 0, 0, 50, 50, 50, 100, 100, 100]
    memory: list[int | None] = [1 << 30] * 4 + [8 << 30] * 5 + [4 << 30]
    # WHEN its use is summed up
    usage = gpu_job_usage(series(times, util, memory), START_S, START_S + 10, interval_s=1.0)
    # THEN each figure is what the samples say, and the whole job is covered
    assert usage.mean_utilization_pct == pytest.approx(45.1)
    assert usage.peak_utilization_pct == 100
    assert usage.peak_memory_used_bytes == 8 << 30
    assert usage.idle_s == pytest.approx(4.0)
    assert usage.covered_s == pytest.approx(10.0)
    assert not usage.history_short and shortfalls([usage]) == []


def test_samples_outside_the_job_are_left_out() -> None:
    # GIVEN a busy GPU before and after a job during which it idles
    times = [START_S - 5 + i for i in range(20)]
    util: list[int | None] = [100] * 5 + [0] * 10 + [100] * 5
    memory: list[int | None] = [80 << 30] * 5 + [1 << 30] * 10 + [80 << 30] * 5
    # WHEN the job's 10 s are summed up (the sample at its end belongs to it)
    usage = gpu_job_usage(series(times, util, memory), START_S, START_S + 9.5)
    # THEN nothing of the other work shows
    assert (usage.peak_utilization_pct, usage.peak_memory_used_bytes) == (0, 1 << 30)
    assert usage.idle_s == pytest.approx(9.5)


def test_a_history_that_starts_after_the_job_says_so() -> None:
    # GIVEN a 3 h job of which the daemon holds only the last 58 min
    end_s = START_S + 3 * 3600
    times = [end_s - 58 * 60 + 60 * i for i in range(58)]
    usage = gpu_job_usage(series(times, [90] * 58, [1] * 58), START_S, end_s, interval_s=60)
    # THEN it is short, and says how much it covers of how long a job
    assert usage.history_short
    assert usage.covered_s == pytest.approx(58 * 60)
    (line,) = shortfalls([usage])
    assert "covers only the last 58 min of this 3h 00m job" in line


def test_a_gap_is_not_filled_in() -> None:
    # GIVEN a 100 s job sampled every second, but for 40 s when the daemon was down
    times = [START_S + i for i in range(30)] + [START_S + i for i in range(70, 100)]
    usage = gpu_job_usage(series(times, [0] * 60, [0] * 60), START_S, START_S + 100)
    # THEN the silence counts neither as covered nor as idle, and is named a gap
    assert usage.gaps == 1 and usage.history_short
    assert usage.covered_s == pytest.approx(62.0)  # 59 samples of 1 s, the last before the gap 3 s
    assert usage.idle_s == pytest.approx(usage.covered_s)
    assert "1 gap" in shortfalls([usage])[0]


def test_a_fast_daemons_late_sample_on_a_busy_node_is_not_a_gap() -> None:
    # GIVEN a daemon sampling every 0.2 s whose samples came 1.5 s apart once (a stall),
    # and 5 s apart once (it was down)
    times = [START_S + 0.2 * i for i in range(10)]
    times += [times[-1] + 1.5 + 0.2 * i for i in range(10)]
    times += [times[-1] + 5 + 0.2 * i for i in range(10)]
    end_s = times[-1] + 0.2
    usage = gpu_job_usage(series(times, [50] * 30, [1] * 30), START_S, end_s, interval_s=0.2)
    # THEN only the long silence is a gap
    assert usage.gaps == 1
    assert usage.covered_s == pytest.approx(end_s - START_S - 5 + 2)


def test_a_history_that_stops_before_the_end_of_the_job_has_a_gap() -> None:
    # GIVEN a daemon that stopped sampling halfway through the job
    times = [START_S + i for i in range(50)]
    usage = gpu_job_usage(series(times, [70] * 50, [5] * 50), START_S, START_S + 100)
    # THEN the end is not covered
    assert usage.gaps == 1 and usage.covered_s == pytest.approx(52.0)


def test_no_sample_in_the_job_gives_no_figures() -> None:
    # GIVEN a history of other times only
    usage = gpu_job_usage(series([START_S - 10], [50], [9]), START_S, START_S + 2)
    # THEN nothing is made up, and the report says the history holds nothing of the job
    assert usage.samples == 0 and usage.covered_s == 0.0
    assert (usage.mean_utilization_pct, usage.peak_memory_used_bytes) == (None, None)
    assert usage.history_short
    assert shortfalls([usage]) == ["GPU 3: the daemon's history holds no sample of this job's time"]


def test_unreported_utilisation_is_covered_but_neither_idle_nor_averaged() -> None:
    # GIVEN samples where the GPU reported no utilisation for half the time
    times = [START_S + i for i in range(4)]
    usage = gpu_job_usage(series(times, [None, None, 80, 80], [1, 2, 3, 4]), START_S, START_S + 4)
    # THEN the mean is over what was reported
    assert usage.mean_utilization_pct == pytest.approx(80.0)
    assert usage.idle_s == 0.0 and usage.covered_s == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(45, "45s"), (58 * 60, "58 min"), (3 * 3600 + 120, "3h 02m"), (52 * 3600, "2d 04h")],
    ids=["seconds", "minutes", "hours", "days"],
)
def test_spans_are_shown_rounded(seconds: float, shown: str) -> None:
    assert about(seconds) == shown


def test_one_shortfall_of_several_gpus_is_said_once() -> None:
    # GIVEN two GPUs whose history starts equally late, and one whose history is whole
    end_s = START_S + 3600
    late = series([end_s - 60 + i for i in range(60)], [5] * 60, [1] * 60)
    whole = series([START_S + i for i in range(3600)], [5] * 3600, [1] * 3600)
    usages = [gpu_job_usage(s, START_S, end_s) for s in (late, late, whole)]
    usages[1] = msgspec.structs.replace(usages[1], index=5)
    # WHEN what the history cannot tell is said THEN it is one line naming both GPUs
    (line,) = shortfalls(usages)
    assert line.startswith("GPUs 3, 5: the history covers only the last 60s of this 60 min job")
