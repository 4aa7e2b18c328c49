"""The job table's JSON record: what the daemon sends and status reads back."""

from __future__ import annotations

import pytest

from gpuwatch.jobs.job_table import Job, JobTable, table_from_record, table_record
from gpuwatch.record_fields import BadRecord

TABLE = JobTable(
    jobs=(
        Job("41", "ada", "train", (7, 5), 1_700_000_000.0, 3600.0),
        Job("42_3", None, None, (), None, None, state="COMPLETING"),
    ),
    read_at=1_700_000_100.0,
    source="squeue --json",
)


def test_a_table_comes_back_from_its_record_with_every_job_and_gpu() -> None:
    again = table_from_record(table_record(TABLE))

    assert again == TABLE
    assert again is not None and again.job_on(5) == TABLE.jobs[0]


def test_jobs_unknown_stays_unknown_and_keeps_its_reason() -> None:
    record = table_record(None, error="squeue: timed out after 2 s")

    assert record == {"known": False, "error": "squeue: timed out after 2 s", "jobs": None}
    assert table_from_record(record) is None


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda r: r.update(jobs="41"), id="jobs-not-a-list"),
        pytest.param(lambda r: r.pop("read_at"), id="no-read-time"),
        pytest.param(lambda r: r.update(doubts={}), id="doubts-not-a-list"),
    ],
)
def test_a_malformed_table_is_refused_not_believed(mutate) -> None:  # type: ignore[no-untyped-def]
    record = table_record(TABLE)
    mutate(record)

    with pytest.raises(BadRecord):
        table_from_record(record)


@pytest.mark.parametrize(
    ("mutate", "doubted_minors"),
    [
        pytest.param(lambda r: r["jobs"].append(7), (), id="job-not-an-object"),
        pytest.param(
            lambda r: r["jobs"][0].update(gpu_minor_numbers=[True]), (), id="minor-a-bool"
        ),
        pytest.param(
            lambda r: r["jobs"][0].update(gpu_minor_numbers=[-1, 5]), (5,), id="minor-negative"
        ),
        pytest.param(lambda r: r["jobs"][0].update(job_id=""), (7, 5), id="empty-id"),
        pytest.param(lambda r: r["jobs"][0].update(user="a\x1b[2Jb"), (7, 5), id="escape-in-user"),
        pytest.param(
            lambda r: r["jobs"][0].update(started_at=float("nan")), (7, 5), id="nan-start"
        ),
        pytest.param(lambda r: r["jobs"][0].update(started_at=1e300), (7, 5), id="time-1e300"),
        pytest.param(lambda r: r["jobs"][0].update(user="u" * 250), (7, 5), id="user-250"),
    ],
)
def test_a_job_that_cannot_be_believed_is_dropped_alone_as_a_doubt(  # type: ignore[no-untyped-def]
    mutate, doubted_minors
) -> None:
    # GIVEN a daemon's record of two jobs, one of them malformed
    record = table_record(TABLE)
    mutate(record)
    # WHEN a client reads it back
    table = table_from_record(record)
    # THEN the other job stands, and the bad one is a doubt naming what it could read of
    # its GPUs (none readable: every GPU of the node is in doubt)
    assert table is not None
    appended = len(record["jobs"]) > len(TABLE.jobs)
    assert [job.job_id for job in table.jobs] == (["41", "42_3"] if appended else ["42_3"])
    assert len(table.doubts) == 1
    assert table.doubts[0].gpu_minor_numbers == doubted_minors
    assert table.doubts[0].whole_node is (not doubted_minors)
