"""The jobs' series of /metrics: who holds each GPU, idle held GPUs, and whether jobs are known."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.sim import SimBackend
from gpuwatch.daemon.job_watch import JobsNow
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.view import View
from gpuwatch.jobs.job_table import Job, JobTable
from gpuwatch.models import Snapshot
from gpuwatch.sampling.poller import PollState
from tests.helpers.cli import FROZEN_TIME

TABLE = JobTable(
    (
        Job("4242", "alice", "train", (0, 2), None, None),
        Job("4243_7", None, "array", (3,), None, None),
        Job("4244", "bob", "cpu", (), None, None),
    ),
    read_at=FROZEN_TIME,
)


def snapshot() -> Snapshot:
    return SimBackend(4, clock=lambda: FROZEN_TIME).sample()


def scrape(jobs: JobsNow, *, current: bool = True) -> dict[str, list]:  # type: ignore[type-arg]
    view = View(
        PollState(snapshot(), None, 0.0, 1), None if current else "sampling fails", jobs=jobs
    )
    text = exposition(view).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def held(table: JobTable, idle: dict[int, float]) -> JobsNow:
    uuids = {gpu.index: gpu.uuid for gpu in snapshot().gpus}
    return JobsNow(table, None, 600.0, {str(uuids[index]): s for index, s in idle.items()})


def test_each_held_gpu_names_its_job_and_user_in_one_info_series() -> None:
    # GIVEN job 4242 (alice) on GPUs 0 and 2, array task 4243_7 (user unknown) on GPU 3
    metrics = scrape(held(TABLE, {0: 0.0, 2: 90.0, 3: 5.0}))
    # THEN one job_info series per held GPU, and none for free GPU 1 nor the GPU-less job
    info = {
        s.labels["gpu"]: (s.labels["job_id"], s.labels["job_user"])
        for s in metrics["gpuwatch_gpu_job_info"]
    }
    assert info == {"0": ("4242", "alice"), "2": ("4242", "alice"), "3": ("4243_7", "")}
    assert {s.value for s in metrics["gpuwatch_gpu_job_info"]} == {1}
    assert metrics["gpuwatch_jobs_known"][0].value == 1
    assert metrics["gpuwatch_jobs_idle_window_seconds"][0].value == 600
    # AND the uuid and hostname join it onto the GPU's other series
    uuids = {gpu.index: gpu.uuid for gpu in snapshot().gpus}
    first = metrics["gpuwatch_gpu_job_info"][0]
    assert first.labels["uuid"] == uuids[int(first.labels["gpu"])]
    assert first.labels["hostname"] == snapshot().hostname


def test_no_other_series_carries_a_job() -> None:
    metrics = scrape(held(TABLE, {0: 0.0, 2: 90.0, 3: 5.0}))
    with_job = {
        name
        for name, samples in metrics.items()
        for sample in samples
        if {"job", "job_id", "job_user"} & sample.labels.keys()
    }
    assert with_job == {"gpuwatch_gpu_job_info"}


def test_idle_seconds_are_sent_for_held_gpus_only() -> None:
    metrics = scrape(held(TABLE, {0: 0.0, 2: 90.0, 3: 5.0}))
    idle = {s.labels["gpu"]: s.value for s in metrics["gpuwatch_gpu_allocated_idle_seconds"]}
    assert idle == {"0": 0.0, "2": 90.0, "3": 5.0}


def test_while_jobs_are_unknown_no_gpu_is_said_to_be_held() -> None:
    metrics = scrape(JobsNow(None, "Slurm did not answer within 5s", 600.0))
    assert metrics["gpuwatch_jobs_known"][0].value == 0
    assert "gpuwatch_gpu_job_info" not in metrics or not metrics["gpuwatch_gpu_job_info"]
    assert not metrics.get("gpuwatch_gpu_allocated_idle_seconds")


def test_while_the_snapshot_is_not_current_no_idle_time_is_sent() -> None:
    # GIVEN sampling that fails: what the last sample saw is no longer a reading
    metrics = scrape(held(TABLE, {2: 900.0}), current=False)
    # THEN no idle time is sent (an alert must not fire on a frozen count)
    assert not metrics.get("gpuwatch_gpu_allocated_idle_seconds")
