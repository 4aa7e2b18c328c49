"""How long a GPU a job holds has computed nothing: counted per uuid, reset by use or a new job."""

from __future__ import annotations

import pytest

from gpuwatch.jobs.job_table import Job, JobTable
from gpuwatch.models import GpuSample
from gpuwatch.sampling.allocated_idle import AllocatedIdle


def gpu(minor: int, utilization_pct: int | None) -> GpuSample:
    return GpuSample(
        index=minor,
        uuid=f"GPU-{minor}",
        name=None,
        pci_bus_id=None,
        utilization_pct=utilization_pct,
        minor_number=minor,
    )


def jobs(*held: tuple[str, tuple[int, ...]]) -> JobTable:
    return JobTable(
        tuple(Job(job_id, "alice", None, minors, None, None) for job_id, minors in held), 0.0
    )


def fed(samples: list[tuple[float, list[GpuSample], JobTable | None]]) -> AllocatedIdle:
    idle = AllocatedIdle()
    for now, gpus, table in samples:
        idle.update(gpus, table, now)
    return idle


def test_a_held_gpu_that_stays_idle_counts_from_its_first_idle_sample() -> None:
    # GIVEN job 7 holding GPU 0, idle at 0 % and 1 % for a minute
    table = jobs(("7", (0,)))
    idle = fed(
        [(100.0, [gpu(0, 0)], table), (130.0, [gpu(0, 1)], table), (160.0, [gpu(0, 0)], table)]
    )
    # THEN it has been idle 60 s
    assert idle.idle_s(table, [gpu(0, 0)]) == {"GPU-0": 60.0}


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        ((gpu(0, 50), jobs(("7", (0,)))), 0.0),
        ((gpu(0, None), jobs(("7", (0,)))), 0.0),
        ((gpu(0, 0), jobs(("8", (0,)))), 30.0),
    ],
    ids=["used", "utilization-unknown", "another-job"],
)
def test_the_count_starts_afresh_when_the_gpu_computes_or_changes_hands(
    second: tuple[GpuSample, JobTable], expected: float
) -> None:
    # GIVEN GPU 0 idle under job 7, then one sample where it computes, cannot tell, or job 8 has it
    first = jobs(("7", (0,)))
    sample, table = second
    idle = fed([(100.0, [gpu(0, 0)], first), (130.0, [sample], table), (160.0, [gpu(0, 0)], table)])
    # THEN the count started afresh: at the next idle sample, or with job 8
    assert idle.idle_s(table, [gpu(0, 0)]) == {"GPU-0": expected}


def test_a_gpu_in_use_is_held_for_0_seconds_and_a_free_one_is_not_listed() -> None:
    # GIVEN job 7 holding GPU 0 (busy); GPU 1 idle and held by nobody
    table = jobs(("7", (0,)))
    gpus = [gpu(0, 90), gpu(1, 0)]
    idle = fed([(100.0, gpus, table), (200.0, gpus, table)])
    # THEN only the held GPU is listed, at 0 s
    assert idle.idle_s(table, gpus) == {"GPU-0": 0.0}


def test_a_job_that_ended_leaves_no_count_behind() -> None:
    # GIVEN GPU 0 idle under job 7, then free, then job 7's id again (a requeue)
    held, free = jobs(("7", (0,))), jobs()
    idle = fed([(100.0, [gpu(0, 0)], held), (130.0, [gpu(0, 0)], free), (160.0, [gpu(0, 0)], held)])
    # THEN the count started when the job held it again
    assert idle.idle_s(held, [gpu(0, 0)]) == {"GPU-0": 0.0}


def test_while_jobs_are_unknown_an_idle_gpu_keeps_counting_but_nothing_is_shown() -> None:
    # GIVEN GPU 0 idle under job 7, then Slurm silent for a while, then job 7 again
    table = jobs(("7", (0,)))
    idle = fed([(100.0, [gpu(0, 0)], table), (200.0, [gpu(0, 0)], None)])
    # THEN nothing is claimed while unknown
    assert idle.idle_s(None, [gpu(0, 0)]) == {}
    # AND once Slurm answers that job 7 still holds it, the silence counted as idle
    idle.update([gpu(0, 0)], table, 300.0)
    assert idle.idle_s(table, [gpu(0, 0)]) == {"GPU-0": 200.0}


def test_a_gpu_used_while_jobs_are_unknown_starts_afresh() -> None:
    table = jobs(("7", (0,)))
    idle = fed(
        [(100.0, [gpu(0, 0)], table), (200.0, [gpu(0, 80)], None), (300.0, [gpu(0, 0)], table)]
    )
    assert idle.idle_s(table, [gpu(0, 0)]) == {"GPU-0": 0.0}


def test_a_job_started_since_the_last_sample_has_idled_for_0_seconds() -> None:
    # GIVEN GPU 0 idle under job 7 at the last sample, and job 8 on it in the table asked now
    idle = fed([(100.0, [gpu(0, 0)], jobs(("7", (0,)))), (160.0, [gpu(0, 0)], jobs(("7", (0,))))])
    # THEN job 8 is not blamed for job 7's idle minute
    assert idle.idle_s(jobs(("8", (0,))), [gpu(0, 0)]) == {"GPU-0": 0.0}
