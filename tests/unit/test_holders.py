"""The one model of who holds each device (`gpuwatch.holders`), built from a job table and
judged by the placement rules: a held device is never given, nor one whose holders are
unknown, unless the request takes those; a record that cannot be believed makes only the
devices it names unknown."""

from __future__ import annotations

import pytest

from gpuwatch.holders import NO_HOLDERS, Holder, HolderKind, holder_problem, holders_on
from gpuwatch.jobs.job_table import Doubt, Job, JobTable, NodeJobs, Pod
from gpuwatch.models import GpuSample, MigDevice, Snapshot
from gpuwatch.placement.gpus import GPUS
from gpuwatch.placement.mig import MIG_DEVICES
from gpuwatch.placement.rules import place
from gpuwatch.request import Request

GIB = 1 << 30


def gpu(index: int, minor: int | None, *, split: bool = False) -> GpuSample:
    return GpuSample(
        index,
        f"GPU-{index}",
        "H100",
        None,
        80 * GIB,
        0,
        80 * GIB,
        utilization_pct=None if split else 0,
        mig_enabled=split,
        minor_number=minor,
    )


MIGS = (
    MigDevice(2, 0, "MIG-2-0", profile="3g.40gb", gpu_instance_id=1, memory_free_bytes=40 * GIB),
    MigDevice(2, 1, "MIG-2-1", profile="1g.10gb", gpu_instance_id=2, memory_free_bytes=10 * GIB),
)
NODE = Snapshot(0.0, "n", None, None, (gpu(0, 4), gpu(1, 5), gpu(2, 6, split=True)), (), MIGS)
ALICE = Job("41", "alice", "train", (4,), None, None)
POD_JOB = Job("ml/a", None, "c", (), None, None, device_uuids=("MIG-2-1",), pod=Pod("ml", "a", "c"))


def test_a_job_holds_its_gpus_by_minor_number_and_a_pod_its_mig_device_by_uuid() -> None:
    holders = JobTable((ALICE, POD_JOB), 0.0).holders(NODE)
    assert holders.holders_of(NODE.gpus[0]) == (Holder(HolderKind.JOB, "41", user="alice"),)
    assert holders.holders_of(NODE.gpus[1]) == ()
    assert holders.holders_of(MIGS[1]) == (Holder(HolderKind.POD, "ml/a", container="c"),)
    assert holders.holders_of(MIGS[0]) == ()
    assert holders.known and not holders.unknown


def test_a_job_holding_a_split_gpu_whole_holds_each_of_its_mig_devices() -> None:
    holders = JobTable((Job("7", "bob", None, (6,), None, None),), 0.0).holders(NODE)
    assert [holders.holders_of(device) for device in MIGS] == [
        (Holder(HolderKind.JOB, "7", user="bob"),)
    ] * 2
    chosen = place(MIG_DEVICES, NODE, Request(mig="any"), holders=holders)
    assert not chosen.satisfied
    assert chosen.reasons[0] == "MIG 2:0 (3g.40gb): held by job 7 (bob)"


def test_the_rules_never_give_a_held_gpu_and_name_its_holder() -> None:
    holders = JobTable((ALICE,), 0.0).holders(NODE)
    choice = place(GPUS, NODE, Request(count=2), holders=holders)
    assert not choice.satisfied
    assert choice.reasons[0] == "GPU 0: held by job 41 (alice)"


@pytest.mark.parametrize(
    ("holders", "unknown"),
    [
        pytest.param(NodeJobs(None, "Slurm did not answer within 1s", scheduler=True), [0, 1],
                     id="engine-silent"),
        pytest.param(NodeJobs(JobTable((), 0.0, doubts=(Doubt("bad", (5,)),)), scheduler=True),
                     [1], id="doubt-by-minor"),
        pytest.param(NodeJobs(JobTable((), 0.0, doubts=(Doubt("bad"),)), scheduler=True), [0, 1],
                     id="doubt-of-nothing-readable"),
    ],
)  # fmt: skip
def test_unknown_holders_are_never_given_unless_the_request_takes_them(
    holders: NodeJobs, unknown: list[int]
) -> None:
    model = holders.holders(NODE)
    refused = place(GPUS, NODE, Request(count=2), holders=model)
    assert not refused.satisfied
    assert refused.holders_unknown == len(unknown)
    for index in unknown:
        assert refused.reasons[index].startswith(f"GPU {index}: holders unknown: ")
    taken = place(GPUS, NODE, Request(count=2, allow_unknown_holders=True), holders=model)
    assert taken.satisfied


def test_no_scheduler_here_holds_nothing_and_knows_it() -> None:
    assert NodeJobs().holders(NODE) is NO_HOLDERS
    assert place(GPUS, NODE, Request(count=2), holders=NO_HOLDERS).satisfied


def test_a_gpu_whose_minor_number_is_not_told_is_unknown_where_jobs_name_gpus_so() -> None:
    # GIVEN a sample that lacks GPU 1's minor number, and a Slurm job on some GPU
    blind = Snapshot(0.0, "n", None, None, (gpu(0, 4), gpu(1, None)), ())
    holders = JobTable((Job("9", "eve", None, (5,), None, None),), 0.0).holders(blind)
    # THEN GPU 1 (which the job may hold) is unknown; GPU 0 (minor 4, no job) is free
    assert holders.unknown_of(blind.gpus[1]) is not None
    assert holders.unknown_of(blind.gpus[0]) is None


@pytest.mark.parametrize(
    "job",
    [
        Job("", "ada", None, (4,), None, None),
        Job("1", "u" * 250, None, (4,), None, None),
        Job("1", "ada", None, (4,), 1e300, None),
        Job("1", "ada", None, tuple(range(1025)), None, None),
        Job("/x", None, None, (), None, None, device_uuids=("GPU-0",), pod=Pod("", "x", "c")),
        Job("ns/", None, None, (), None, None, device_uuids=("GPU-0",), pod=Pod("ns", "", "c")),
    ],
    ids=["empty-id", "user-250", "time-1e300", "1025-gpus", "empty-namespace", "empty-pod"],
)
def test_a_job_that_cannot_be_believed_is_dropped_alone_its_gpus_unknown(job: Job) -> None:
    # GIVEN an engine's table of that job and alice's job on GPU 0 (minor 4)
    table = JobTable((job, Job("2", "bob", None, (5,), None, None)), 0.0)
    # THEN the other job stands; the bad one is a doubt, its devices unknown
    assert [j.job_id for j in table.jobs] == ["2"]
    (doubt,) = table.doubts
    holders = table.holders(NODE)
    assert holders.holders_of(NODE.gpus[1]) == (Holder(HolderKind.JOB, "2", user="bob"),)
    assert holders.unknown_of(NODE.gpus[0]) is not None
    assert doubt.whole_node or holders.unknown_of(NODE.gpus[2]) is None


def test_the_one_check_refuses_what_cannot_name_a_holder() -> None:
    assert holder_problem(HolderKind.POD, "ml/a", None, "c") is None
    assert holder_problem(HolderKind.POD, "ml/", None, "c") is not None
    assert holder_problem(HolderKind.JOB, "", "alice") is not None
    assert holder_problem(HolderKind.JOB, "1", 7) is not None


def test_more_holders_than_a_device_can_have_make_it_unknown() -> None:
    many = [Holder(HolderKind.POD, f"ns/p{n}") for n in range(1025)]
    holders = holders_on(NODE, {"GPU-0": many})
    assert holders.holders_of(NODE.gpus[0]) == ()
    assert holders.unknown_of(NODE.gpus[0]) == "over 1024 holders told"
