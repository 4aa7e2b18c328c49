"""Slurm's answers parsed: recorded outputs of 22.05 and the 24.11 JSON shape, and garbage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.jobs import Job
from gpuwatch.jobs.job_table import Doubt
from gpuwatch.jobs.slurm_text import (
    MAX_DOUBTS,
    SlurmFormatError,
    detail_indices,
    jobs_from_squeue_json,
    name_in_detail,
    parse_duration_s,
    rows_from_squeue,
    timestamp,
)

DATA = Path(__file__).parent / "data"
MINORS_IN_ORDER: list[int | None] = [0, 1, 2, 3]
STARTED_22_05 = 1795473311.0  # 2026-11-23T22:35:11 UTC, when the 22.05 recording was made


def by_id(found: tuple[list[Job], list[Doubt]]) -> dict[str, Job]:
    """The jobs of an answer by id, where it holds no doubt."""
    jobs, doubts = found
    assert doubts == []
    return {job.job_id: job for job in jobs}


def test_slurm_22_05_answers_give_each_running_job_and_its_gpus() -> None:
    # GIVEN Slurm 22.05's answer with three running jobs and one pending
    # WHEN it is read for node vm
    jobs = by_id(
        jobs_from_squeue_json((DATA / "squeue-22.05.json").read_text(), "vm", MINORS_IN_ORDER)
    )
    # THEN the running jobs are there with the GPUs their GRES indices name, the pending is not
    assert jobs == {
        "1": Job("1", "root", "train", (0, 1), STARTED_22_05, 90 * 60.0),
        "2": Job("2", "root", "eval", (2,), STARTED_22_05, None),
        "3": Job("3", "root", "cpu-only", (), STARTED_22_05, 86400.0),
    }


def test_gres_indices_become_the_minor_numbers_gres_conf_gives_them() -> None:
    # GIVEN gres.conf naming /dev/nvidia7, /dev/nvidia5, /dev/nvidia6, /dev/nvidia4 in order
    minors: list[int | None] = [7, 5, 6, 4]
    # WHEN job 1 holds GRES indices 0-1 and job 2 index 2
    jobs = by_id(jobs_from_squeue_json((DATA / "squeue-22.05.json").read_text(), "vm", minors))
    # THEN their GPUs are named by minor number, not by index
    assert jobs["1"].gpu_minor_numbers == (5, 7)
    assert jobs["2"].gpu_minor_numbers == (6,)


def test_slurm_24_11_json_gives_this_nodes_share_of_a_multi_node_job() -> None:
    # GIVEN the 24.11 shape: a job on gpu[13-14], an array task and a job without GPUs
    text = (DATA / "squeue-24.11.json").read_text()
    # WHEN it is read for gpu14, then for gpu13
    on_14 = by_id(jobs_from_squeue_json(text, "gpu14", MINORS_IN_ORDER))
    on_13 = by_id(jobs_from_squeue_json(text, "gpu13", MINORS_IN_ORDER))
    # THEN each node sees the GPUs of its own gres_detail entry
    assert on_14 == {
        "290094": Job("290094", "alice", "llm-pretrain", (0, 1, 2, 3), 1795470000.0, 86400.0)
    }
    assert on_13["290094"].gpu_minor_numbers == (0, 2)
    # AND an array task is named as Slurm names it, with an unlimited time limit
    assert on_13["289497_7"] == Job("289497_7", "bob", "sweep", (1,), 1795473000.0, None)
    assert on_13["290102"].gpu_minor_numbers == ()
    assert "290103" not in on_13


def test_slurm_23_02_json_with_a_hostlist_string_for_nodes() -> None:
    # GIVEN 23.02's shape: number objects, job_resources.nodes still a hostlist string
    job = {
        "job_id": 77,
        "job_state": "RUNNING",
        "user_name": "erin",
        "name": "x",
        "nodes": "n[1-3]",
        "job_resources": {"nodes": "n[1-3]", "allocated_nodes": []},
        "gres_detail": ["gpu:1(IDX:0)", "gpu:1(IDX:3)", "gpu:1(IDX:1)"],
        "start_time": {"set": True, "infinite": False, "number": 1000},
        "time_limit": {"set": True, "infinite": False, "number": 5},
    }
    # WHEN it is read for the second node
    jobs = jobs_from_squeue_json(json.dumps({"jobs": [job]}), "n2", MINORS_IN_ORDER)
    # THEN n2 holds the GPU of the second gres_detail entry
    assert jobs == ([Job("77", "erin", "x", (3,), 1000.0, 300.0)], [])


GOOD = {
    "job_id": 5,
    "job_state": "RUNNING",
    "user_name": "u",
    "name": "n",
    "nodes": "vm",
    "gres_detail": ["gpu:1(IDX:0)"],
    "start_time": 1,
    "time_limit": 1,
}


GRES_1025 = "gpu:1(IDX:0" + ",0" * 1024 + ")"


@pytest.mark.parametrize(
    ("bad", "gpus"),
    [
        pytest.param({**GOOD, "job_id": "5; rm -rf"}, (0,), id="id-a-string"),
        pytest.param({**GOOD, "job_id": -1}, (0,), id="id-negative"),
        pytest.param({**GOOD, "job_id": True}, (0,), id="id-a-bool"),
        pytest.param({**GOOD, "job_id": 1.5}, (0,), id="id-a-fraction"),
        pytest.param({**GOOD, "job_id": 1e300}, (0,), id="id-1e300"),
        pytest.param({**GOOD, "job_id": 1 << 32}, (0,), id="id-past-32-bits"),
        pytest.param({**GOOD, "array_task_id": -7, "array_job_id": 4}, (0,), id="task-negative"),
        pytest.param({**GOOD, "user_name": ["root"]}, (0,), id="user-a-list"),
        pytest.param({**GOOD, "user_name": "u" * 250}, (0,), id="user-of-250-characters"),
        pytest.param({**GOOD, "start_time": "yesterday"}, (0,), id="start-a-string"),
        pytest.param({**GOOD, "start_time": 1e300}, (0,), id="start-1e300"),
        pytest.param({**GOOD, "time_limit": {"set": True, "number": "x"}}, (0,), id="limit-x"),
        pytest.param({**GOOD, "time_limit": 1e300}, (0,), id="limit-1e300"),
        pytest.param({**GOOD, "job_state": 7}, (0,), id="state-a-number"),
        pytest.param({**GOOD, "gres_detail": "gpu:1(IDX:0)"}, (), id="gres-not-a-list"),
        pytest.param({**GOOD, "gres_detail": {"0": "gpu:1(IDX:0)"}}, (), id="gres-an-object"),
        pytest.param({**GOOD, "gres_detail": [{"gpu": 1}]}, (), id="gres-detail-an-object"),
        pytest.param({**GOOD, "gres_detail": ["gpu:2000(IDX:0-1999)"]}, (), id="gres-2000"),
        pytest.param({**GOOD, "gres_detail": [GRES_1025]}, (), id="gres-1025-entries"),
        pytest.param({**GOOD, "gres_detail": ["gpu:2(IDX:0-x)"]}, (), id="gres-unparseable"),
        pytest.param({**GOOD, "nodes": 7}, (), id="nodes-a-number"),
        pytest.param({**GOOD, "nodes": "vm[0-65535]x[0-65535]"}, (), id="nodes-4-gi-names"),
        pytest.param(
            {**GOOD, "job_resources": {"nodes": {"allocation": [7]}}}, (), id="allocation-junk"
        ),
        pytest.param("a job", (), id="not-an-object"),
        pytest.param(None, (), id="null"),
    ],
)  # fmt: skip
def test_a_job_that_cannot_be_believed_is_a_doubt_and_the_others_stand(
    bad: Any, gpus: tuple[int, ...]
) -> None:
    # GIVEN an answer with one job that cannot be believed beside a good one
    text = json.dumps({"jobs": [bad, {**GOOD, "job_id": 6, "gres_detail": ["gpu:1(IDX:3)"]}]})
    # WHEN it is read
    jobs, doubts = jobs_from_squeue_json(text, "vm", MINORS_IN_ORDER)
    # THEN the good job stands; the other is one doubt, saying why in one line, naming the
    # GPUs it holds where they can be read, else none (then the whole node is in doubt)
    assert [job.job_id for job in jobs] == ["6"]
    (doubt,) = doubts
    assert doubt.gpu_minor_numbers == gpus and doubt.whole_node == (not gpus)
    assert doubt.why and doubt.why.isprintable() and len(doubt.why) < 400


def test_a_job_elsewhere_is_passed_over_however_it_is_written() -> None:
    # GIVEN jobs on another node, or pending, with fields no job here could have
    others = [
        {**GOOD, "nodes": "other", "user_name": 7, "start_time": 1e300},
        {**GOOD, "job_state": "PENDING", "nodes": 7, "gres_detail": {}},
    ]
    # WHEN the answer is read for vm THEN neither is a job or a doubt here
    assert jobs_from_squeue_json(json.dumps({"jobs": others}), "vm", MINORS_IN_ORDER) == ([], [])


def test_a_job_number_past_pythons_digits_is_doubted_alone() -> None:
    # GIVEN a job id of 5,000 digits (past the digits Python reads into an integer)
    text = '{"jobs": [{"job_id": ' + "9" * 5000 + ', "job_state": "RUNNING", "nodes": "vm"}]}'
    # THEN it is one doubt, not an answer that cannot be read
    jobs, (doubt,) = jobs_from_squeue_json(text, "vm", MINORS_IN_ORDER)
    assert jobs == [] and doubt.why.startswith("a job: ")


def test_many_records_that_cannot_be_believed_are_kept_few() -> None:
    bad = [{**GOOD, "job_id": n, "gres_detail": 7} for n in range(1, 1001)]
    jobs, doubts = jobs_from_squeue_json(json.dumps({"jobs": bad}), "vm", MINORS_IN_ORDER)
    assert jobs == [] and len(doubts) == MAX_DOUBTS
    assert doubts[-1].whole_node and "937 more" in doubts[-1].why


def test_control_characters_and_long_names_are_defused() -> None:
    # GIVEN a job whose name carries terminal escapes and is very long
    job = {**GOOD, "name": "\x1b[2J\x1b]0;pwned\x07" + "x" * 100_000, "user_name": "a\nb"}
    # WHEN it is read
    (read,), _ = jobs_from_squeue_json(json.dumps({"jobs": [job]}), "vm", MINORS_IN_ORDER)
    # THEN no control character survives and the name is cut
    assert read.name is not None and read.user == "a?b"
    assert not any(ord(c) < 32 for c in read.name) and len(read.name) <= 256


def test_a_huge_answer_is_read_without_crashing() -> None:
    # GIVEN 20,000 jobs on other nodes and one here
    others = [{**GOOD, "job_id": n, "nodes": f"other{n}"} for n in range(1, 20_001)]
    text = json.dumps({"jobs": [*others, {**GOOD, "job_id": 99_999}]})
    # WHEN it is read
    jobs, doubts = jobs_from_squeue_json(text, "vm", MINORS_IN_ORDER)
    # THEN this node's job is found
    assert [job.job_id for job in jobs] == ["99999"] and doubts == []


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("squeue: error: unrecognized option '--json'", id="text"),
        pytest.param('{"jobs": {}}', id="jobs-not-a-list"),
        pytest.param("[" * 100_000, id="deeply-nested"),
        pytest.param(
            '{"jobs": [], "errors": [{"description": "Unable to contact slurm controller"}]}',
            id="controller-down",
        ),
    ],
)
def test_an_answer_that_is_no_job_list_is_an_error_not_an_empty_table(text: str) -> None:
    # GIVEN squeue's output that is not a list of jobs (slurmctld down gives `errors`)
    # WHEN it is read THEN it is refused as a whole: "jobs unknown", never "no jobs"
    with pytest.raises(SlurmFormatError):
        jobs_from_squeue_json(text, "vm", MINORS_IN_ORDER)


def test_squeue_rows_are_read_field_by_field() -> None:
    # GIVEN squeue -o ROW_FORMAT's recorded answer (22.05): a job with a 90 min limit, one
    # without, both on vm
    rows, doubts = rows_from_squeue((DATA / "squeue-rows-22.05.txt").read_text())
    # THEN each row is a job, its times and limit read
    assert doubts == []
    assert [(r.job_id, r.state, r.user, r.nodes, r.time_limit_s) for r in rows] == [
        ("9", "RUNNING", "root", ("vm",), 5400.0),
        ("10", "RUNNING", "root", ("vm",), None),
    ]
    assert rows[0].start_s == timestamp("2026-11-27T07:00:22")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("9|9|N/A|RUNNING|root\n", id="too-few-fields"),
        pytest.param("x|9|N/A|RUNNING|root|a|b|c|vm\n", id="no-job-id"),
        pytest.param("99999999999|9|N/A|RUNNING|root|a|b|c|vm\n", id="id-past-32-bits"),
        pytest.param("9|9|N/A|RUNNING|root|a|b|c|vm[0-65535]x[0-65535]\n", id="4-gi-nodes"),
    ],
)  # fmt: skip
def test_a_row_that_is_no_row_is_a_doubt_of_the_whole_node(text: str) -> None:
    # GIVEN squeue rows: a good one, and one that is no row
    good = (DATA / "squeue-rows-22.05.txt").read_text().splitlines()[1] + "\n"
    # WHEN read THEN the good row stands, and the other is a doubt naming no GPU
    rows, (doubt,) = rows_from_squeue(good + text)
    assert [row.job_id for row in rows] == ["10"]
    assert doubt.whole_node and doubt.why.startswith("squeue printed")


def test_a_job_name_cannot_forge_its_gpus() -> None:
    # GIVEN scontrol's real answer (22.05) for a job given GRES index 0 whose name carries
    # UserId=, JobState= and a GRES detail of all four GPUs on a line of its own
    text = (DATA / "scontrol-job-forged-name-22.05.txt").read_text()
    # WHEN its GPUs on vm are read THEN two details name vm: which is Slurm's is not known
    with pytest.raises(SlurmFormatError, match="free text"):
        detail_indices(text, "vm")
    # AND the name is shown as data, never read as fields
    name = name_in_detail(text, "root")
    assert name is not None and name.startswith("x UserId=alice(1000) JobState=RUNNING")
    assert "\n" not in name


def test_scontrol_gives_a_jobs_gpus_from_its_one_detail() -> None:
    # GIVEN scontrol's real answer for job "train", given GRES indices 1-2
    text = (DATA / "scontrol-job-train-22.05.txt").read_text()
    # THEN those are its GPUs on vm, and it has none on another node
    assert detail_indices(text, "vm") == [1, 2]
    assert detail_indices(text, "gpu01") is None
    assert name_in_detail(text, "root") == "train"


def test_before_19_05_the_detail_is_gres_idx() -> None:
    text = (
        "JobId=4 JobName=a UserId=bob(7) JobState=RUNNING NodeList=n1 "
        "Nodes=n1 CPU_IDs=0-1 Mem=0 GRES_IDX=gpu(IDX:0,2) MinCPUsNode=1"
    )
    assert detail_indices(text, "n1") == [0, 2]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90", 5400.0, id="minutes"),
        pytest.param("30:00", 1800.0, id="minutes-seconds"),
        pytest.param("01:30:00", 5400.0, id="hours-minutes-seconds"),
        pytest.param("1-00:00:00", 86400.0, id="days-hms"),
        pytest.param("2-12", 216000.0, id="days-hours"),
        pytest.param("1-01:30", 91800.0, id="days-hours-minutes"),
        pytest.param("UNLIMITED", None, id="unlimited"),
        pytest.param("NOT_SET", None, id="not-set"),
        pytest.param("1:2:3:4", None, id="garbage"),
        pytest.param("9" * 5000, None, id="5000-digits"),
    ],
)
def test_slurm_time_limits_in_seconds(text: str, seconds: float | None) -> None:
    assert parse_duration_s(text) == seconds
