"""The work around a node's GPUs, as its gpuwatch daemon exports it: the line of jobs waiting
for GPUs and the scheduler's job on each GPU, read the same scraped directly and through
Prometheus, unknown (never zero) where the exporter does not tell."""

from __future__ import annotations

import pytest

from gpuwatch.fleet.document import fleet_document
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.series import PREFIXES, target_state
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, GpuJob, NodeState
from gpuwatch.tui.fleet.rows import build_rows
from tests.helpers.fleet.fakeprom import NOW, FakePrometheus, FakeTarget, with_node_figures
from tests.helpers.fleet.servers import fixture, serving

TAKEN_AT = 1.7954727494912333e09
WORK = fixture("gpuwatch_node.prom").decode() + fixture("gpuwatch_work.prom").decode()
JOBS = (GpuJob(0, "4242", "carol", 1800.0), GpuJob(1, "4243_7", "alice", 0.0))


def scraped(text: str) -> NodeState:
    samples = list(parse_exposition(text, PREFIXES))
    now = TAKEN_AT + 1
    return target_state(samples, fallback_name="x", seen_at=now, now=now, stale_after_s=15)


def test_a_daemon_tells_its_line_of_waiting_jobs_and_the_job_on_each_gpu() -> None:
    # GIVEN a daemon's /metrics with three jobs in line and Slurm jobs on GPUs 0 and 1
    # WHEN it is scraped
    node = scraped(WORK)
    # THEN the line and the jobs are the node's, each job on its GPU with its idle time
    assert (node.lease_waiters, node.longest_wait_s) == (3, 95.5)
    assert node.jobs == JOBS
    assert node.jobs_on(0) == (JOBS[0],) and node.jobs_on(2) == ()


def test_a_daemon_that_exports_no_line_and_no_jobs_leaves_both_unknown() -> None:
    # GIVEN a daemon of a version before the line, on a node without a scheduler
    node = scraped(fixture("gpuwatch_node.prom").decode())
    # THEN neither is zero: both are unknown
    assert (node.lease_waiters, node.longest_wait_s, node.jobs) == (None, None, None)


def test_dcgm_exporter_tells_neither() -> None:
    node = scraped(fixture("dcgm_node.prom").decode())
    assert (node.lease_waiters, node.longest_wait_s, node.jobs) == (None, None, None)


def series(*extra: Sample) -> list[Sample]:
    head = [
        Sample("gpuwatch_sample_timestamp_seconds", {"hostname": "n"}, 100.0),
        Sample("gpuwatch_gpu_info", {"gpu": "0", "uuid": "GPU-1", "hostname": "n"}, 1.0),
    ]
    return head + list(extra)


def job(gpu: str, job_id: str, value: float = 1.0) -> Sample:
    labels = {"gpu": gpu, "uuid": "GPU-1", "hostname": "n", "job_id": job_id, "job_user": "al"}
    return Sample("gpuwatch_gpu_job_info", labels, value)


def known(value: float) -> Sample:
    return Sample("gpuwatch_jobs_known", {"hostname": "n"}, value)


def state_of(samples: list[Sample]) -> NodeState:
    return target_state(samples, fallback_name="x", seen_at=100, now=100, stale_after_s=15)


@pytest.mark.parametrize(
    ("samples", "jobs"),
    [
        ([known(1)], ()),
        ([known(0), job("0", "7")], None),
        ([known(0.5), job("0", "7")], None),
        ([job("0", "7")], (GpuJob(0, "7", "al"),)),
        ([known(1), job("5", "7"), job("0", ""), job("0", "8", 0.0)], ()),
    ],
    ids=["known-none", "not-known", "known-garbage", "jobs-without-known", "bad-jobs-skipped"],
)
def test_jobs_are_none_only_where_told_and_unknown_where_not(
    samples: list[Sample], jobs: tuple[GpuJob, ...] | None
) -> None:
    assert state_of(series(*samples)).jobs == jobs


@pytest.mark.parametrize(
    ("waiters", "oldest", "expected"),
    [
        (2.0, 30.0, (2, 30.0)),
        (-1.0, -5.0, (None, None)),
        (1.5, 1e12, (None, None)),
        (0.0, 0.0, (0, 0.0)),
    ],
    ids=["plain", "negative", "fraction-and-centuries", "none-waiting"],
)
def test_a_line_out_of_range_is_unknown_not_trusted(
    waiters: float, oldest: float, expected: tuple[int | None, float | None]
) -> None:
    node = state_of(
        series(
            Sample("gpuwatch_lease_waiters", {"hostname": "n"}, waiters),
            Sample("gpuwatch_lease_longest_wait_seconds", {"hostname": "n"}, oldest),
        )
    )
    assert (node.lease_waiters, node.longest_wait_s) == expected


def test_through_prometheus_the_line_and_jobs_are_those_scraped_directly() -> None:
    # GIVEN the daemon's /metrics behind a Prometheus
    target = FakeTarget("gpuwatch", "10.0.0.7:19400", WORK, scraped_at=TAKEN_AT + 1)
    prometheus = FakePrometheus([target])
    with serving(prometheus) as url:
        # WHEN the fleet is read
        (node,) = PrometheusSource(url, clock=lambda: NOW).read().nodes
    # THEN it tells what the node's own /metrics tells
    assert (node.lease_waiters, node.longest_wait_s) == (3, 95.5)
    assert node.jobs == JOBS
    # AND the jobs of every node came in one query, whatever the fleet's size
    assert sum("gpuwatch_gpu_job_info" in query for query in prometheus.asked) == 1


def test_the_json_has_the_line_per_node_and_the_job_per_gpu_null_where_unknown() -> None:
    fleet = FleetState(NOW, "test", (scraped(WORK), scraped(fixture("dcgm_node.prom").decode())))
    gpuwatch, dcgm = fleet_document(fleet)["nodes"]
    assert (gpuwatch["lease_waiters"], gpuwatch["longest_wait_s"]) == (3, 95.5)
    assert gpuwatch["jobs_known"] is True
    jobs = [(g["job_id"], g["job_user"], g["allocated_idle_s"]) for g in gpuwatch["gpus"]]
    assert jobs[:3] == [("4242", "carol", 1800), ("4243_7", "alice", 0.0), (None, None, None)]
    assert (dcgm["lease_waiters"], dcgm["longest_wait_s"], dcgm["jobs_known"]) == (
        None,
        None,
        False,
    )
    assert all(gpu["job_id"] is None for gpu in dcgm["gpus"])


def test_the_fleet_table_read_as_node_figures_counts_its_jobs_and_their_idle_gpus() -> None:
    # GIVEN the daemon's /metrics, with its node's figures, behind a Prometheus
    target = with_node_figures(FakeTarget("gpuwatch", "10.0.0.7:19400", WORK, scraped_at=NOW))
    with serving(FakePrometheus([target])) as url:
        # WHEN the fleet table's source reads it
        source = PrometheusSource(url, clock=lambda: NOW, needs=Needs(per_node=True))
        fleet = source.read()
        (row,) = build_rows(fleet)
    # THEN its row counts two jobs, one of which left its GPU idle past 10 minutes
    assert fleet.nodes[0].summary is not None
    assert (row.jobs, row.idle_allocated, row.lease_waiters) == (2, 1, 3)
