"""The selection policy: which GPUs a job gets, and why the others are refused."""

from __future__ import annotations

import pytest

from gpuwatch.choices import Strategy
from gpuwatch.leases.records import request_from_record, request_record
from gpuwatch.models import GpuSample, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.placement.gpus import choose
from gpuwatch.placement.rules import KEEP_LIMIT_S
from gpuwatch.request import Request, Waiter

GIB = 1 << 30


def gpu(index: int, free_gib: float, util: int = 0, **fields: object) -> GpuSample:
    values: dict[str, object] = {
        "uuid": f"GPU-{index}",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{index:02X}:00.0",
        "memory_total_bytes": 80 * GIB,
        "memory_free_bytes": int(free_gib * GIB),
        "memory_used_bytes": int((80 - free_gib) * GIB),
        "utilization_pct": util,
    }
    values.update(fields)
    return GpuSample(index=index, **values)  # type: ignore[arg-type]


def node(*gpus: GpuSample, processes: tuple[ProcessUsage, ...] = ()) -> Snapshot:
    return Snapshot(0.0, "node", "580", "13.0", gpus, processes)


def lease(index: int, pid: int = 4242, user: str = "alice", mem_gib: float | None = None) -> Lease:
    mem = None if mem_gib is None else int(mem_gib * GIB)
    return Lease(f"GPU-{index}", index, pid, user, "python train.py", 0.0, mem)


FOUR = node(gpu(0, 10, util=90), gpu(1, 70, util=20), gpu(2, 40, util=5), gpu(3, 75, util=60))


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (Request(allow_busy=True), [3]),
        (Request(allow_busy=True, count=2), [3, 1]),
        (Request(allow_busy=True, count=2, strategy=Strategy.LEAST_UTIL), [2, 1]),
        (Request(allow_busy=True, strategy=Strategy.PACK, min_free_bytes=30 * GIB), [2]),
        (Request(allow_busy=True, strategy=Strategy.PACK, mem_bytes=5 * GIB), [0]),
        (Request(allow_busy=True, max_util_pct=50), [1]),
        (Request(allow_busy=True, count=2, min_free_bytes=50 * GIB, max_util_pct=70), [3, 1]),
        (Request(allow_busy=True, allowed=frozenset({0, 2})), [2]),
        (Request(allow_busy=True, excluded=frozenset({3, 1})), [2]),
    ],
    ids=[
        "most-free",
        "two-most-free",
        "least-util",
        "pack-min-free",
        "pack-mem",
        "max-util",
        "filters-combined",
        "allowed-set",
        "excluded",
    ],
)
def test_chooses_and_ranks(request_: Request, expected: list[int]) -> None:
    choice = choose(FOUR, request_)
    assert [g.index for g in choice.chosen] == expected


@pytest.mark.parametrize(
    ("request_", "leases", "reason"),
    [
        (Request(allow_busy=True, min_free_bytes=50 * GIB), (), "GPU 2: 40.0GiB free < 50.0GiB"),
        (
            Request(allow_busy=True, max_util_pct=10),
            (),
            "GPU 1: in use: 20% busy > 10% (--max-util)",
        ),
        (Request(allow_busy=True), (lease(2, 4242, "alice"),), "GPU 2: leased by pid 4242 (alice)"),
        (
            Request(allow_busy=True),
            (lease(2, 7, "bob", mem_gib=5), lease(2, 8, "eve", mem_gib=5)),
            "GPU 2: shared by pid 7 (bob) and 1 more",
        ),
        (
            Request(allow_busy=True, mem_bytes=GIB),
            (lease(2, 9, "carol"),),
            "GPU 2: leased by pid 9 (carol)",
        ),
        (
            Request(allow_busy=True, allowed=frozenset({0})),
            (),
            "GPU 2: not in CUDA_VISIBLE_DEVICES",
        ),
        (Request(allow_busy=True, excluded=frozenset({2})), (), "GPU 2: excluded"),
        (
            Request(allow_busy=True, mem_bytes=35 * GIB),
            (lease(2, 7, "bob", mem_gib=10),),
            "GPU 2: 30.0GiB free after 10.0GiB promised to shared leases < 35.0GiB",
        ),
    ],
    ids=[
        "too-little-free",
        "too-busy",
        "exclusive-lease",
        "shared-leases-vs-exclusive",
        "shared-vs-exclusive-lease",
        "outside-visible-devices",
        "excluded",
        "promised-to-shared",
    ],
)
def test_each_refused_gpu_gets_a_reason(
    request_: Request, leases: tuple[Lease, ...], reason: str
) -> None:
    choice = choose(FOUR, Request(**{**_fields(request_), "count": 4}), leases=leases)
    assert not choice.satisfied
    assert reason in choice.reasons


def _fields(request: Request) -> dict[str, object]:
    return {name: getattr(request, name) for name in Request.__struct_fields__}


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (gpu(0, 70, error="GPU is lost", memory_free_bytes=None), "GPU 0: error: GPU is lost"),
        (gpu(0, 70, memory_free_bytes=None), "GPU 0: free memory unknown"),
    ],
    ids=["lost", "free-unknown"],
)
def test_faulty_or_unknown_gpus_are_never_chosen(broken: GpuSample, reason: str) -> None:
    choice = choose(node(broken, gpu(1, 5)), Request(allow_busy=True))
    assert [g.index for g in choice.chosen] == [1]
    assert choice.reasons == (reason,)


def test_unknown_utilization_fails_a_utilization_limit_only() -> None:
    quiet = gpu(0, 70, utilization_pct=None)
    assert choose(node(quiet), Request(allow_busy=True)).satisfied
    assert choose(node(quiet), Request(allow_busy=True, max_util_pct=50)).reasons == (
        "GPU 0: utilization unknown",
    )


def test_not_enough_lists_every_gpu_including_those_that_qualify() -> None:
    choice = choose(FOUR, Request(allow_busy=True, count=2, min_free_bytes=72 * GIB))
    assert choice.chosen == () and choice.qualifying == 1
    assert choice.reasons == (
        "GPU 0: 10.0GiB free < 72.0GiB",
        "GPU 1: 70.0GiB free < 72.0GiB",
        "GPU 2: 40.0GiB free < 72.0GiB",
        "GPU 3: qualifies (75.0GiB free)",
    )


class TestSharedLeases:
    def test_shared_jobs_join_while_declarations_fit(self) -> None:
        gpus = node(gpu(0, 70))
        holders = (lease(0, 1, mem_gib=30), lease(0, 2, mem_gib=30))
        assert choose(gpus, Request(allow_busy=True, mem_bytes=10 * GIB), leases=holders).satisfied
        assert not choose(
            gpus, Request(allow_busy=True, mem_bytes=11 * GIB), leases=holders
        ).satisfied

    def test_memory_a_holder_already_uses_is_not_promised_twice(self) -> None:
        # GIVEN a holder that declared 30 GiB and already allocated 25 of them
        holder_process = ProcessUsage(1, 0, "GPU-0", 25 * GIB, ProcessKind.COMPUTE)
        gpus = node(gpu(0, 45), processes=(holder_process,))
        # THEN only the 5 GiB it has not allocated yet are held back
        choice = choose(
            gpus, Request(allow_busy=True, mem_bytes=40 * GIB), leases=(lease(0, 1, mem_gib=30),)
        )
        assert choice.satisfied

    def test_an_exclusive_lease_keeps_shared_jobs_out(self) -> None:
        choice = choose(
            node(gpu(0, 70)), Request(allow_busy=True, mem_bytes=GIB), leases=(lease(0),)
        )
        assert not choice.satisfied


class TestWaitingInLine:
    def test_gpus_an_earlier_waiter_can_use_are_kept_for_it(self) -> None:
        earlier = Waiter(100, "alice", Request(allow_busy=True, min_free_bytes=60 * GIB))
        choice = choose(FOUR, Request(allow_busy=True, count=4), waiting_ahead=(earlier,))
        assert "GPU 3: kept for pid 100 (alice), which asked earlier" in choice.reasons
        assert choose(FOUR, Request(allow_busy=True), waiting_ahead=(earlier,)).chosen[0].index == 1

    def test_gpus_no_earlier_waiter_can_use_stay_available(self) -> None:
        earlier = Waiter(100, "alice", Request(allow_busy=True, count=3, min_free_bytes=60 * GIB))
        choice = choose(FOUR, Request(allow_busy=True, count=2), waiting_ahead=(earlier,))
        assert [g.index for g in choice.chosen] == [2, 0]

    def test_later_waiters_queue_behind_earlier_ones(self) -> None:
        line = (Waiter(1, "a", Request(allow_busy=True)), Waiter(2, "b", Request(allow_busy=True)))
        choice = choose(FOUR, Request(allow_busy=True, count=3), waiting_ahead=line)
        assert [g.index for g in choice.chosen] == []
        assert (
            choose(FOUR, Request(allow_busy=True, count=2), waiting_ahead=line).chosen[0].index == 2
        )

    @pytest.mark.parametrize(
        ("waited_s", "kept"),
        [(0.0, True), (KEEP_LIMIT_S - 1, True), (KEEP_LIMIT_S + 1, False)],
        ids=["just-arrived", "nearly-at-the-limit", "past-the-limit"],
    )
    def test_a_waiter_keeps_gpus_for_a_limited_time(self, waited_s: float, kept: bool) -> None:
        # GIVEN a job waiting for every GPU of the node
        earlier = Waiter(100, "alice", Request(allow_busy=True, count=4), waited_s=waited_s)
        # THEN later jobs are kept off the GPUs, but not forever
        assert (
            choose(FOUR, Request(allow_busy=True), waiting_ahead=(earlier,)).satisfied is not kept
        )

    @pytest.mark.parametrize(
        ("users", "satisfied"),
        [(("alice", "alice", "alice"), True), (("alice", "bob", "carol"), False)],
        ids=["one-user", "three-users"],
    )
    def test_only_each_users_first_waiter_keeps_gpus(
        self, users: tuple[str, ...], satisfied: bool
    ) -> None:
        # GIVEN three jobs waiting for one GPU each
        line = tuple(
            Waiter(100 + n, user, Request(allow_busy=True)) for n, user in enumerate(users)
        )
        # THEN one user's queue keeps one GPU, three users' queues keep three
        assert (
            choose(FOUR, Request(allow_busy=True, count=2), waiting_ahead=line).satisfied
            is satisfied
        )

    @pytest.mark.parametrize(
        "impossible",
        [
            Request(allow_busy=True, count=5),
            Request(allow_busy=True, min_free_bytes=81 * GIB),
            Request(allow_busy=True, mem_bytes=81 * GIB),
            Request(allow_busy=True, allowed=frozenset({7})),
            Request(allow_busy=True, count=2, excluded=frozenset({0, 1, 2})),
        ],
        ids=[
            "more-gpus-than-the-node",
            "bigger-than-any-gpu",
            "declares-more-than-any-gpu",
            "only-gpus-not-here",
            "excludes-too-many",
        ],
    )
    def test_a_waiter_this_node_can_never_serve_keeps_nothing(self, impossible: Request) -> None:
        earlier = Waiter(100, "alice", impossible)
        assert choose(FOUR, Request(allow_busy=True, count=4), waiting_ahead=(earlier,)).satisfied


def test_ties_between_equal_gpus_are_broken_differently_by_different_pickers() -> None:
    equal = node(*(gpu(i, 80) for i in range(8)))
    firsts = {
        choose(equal, Request(allow_busy=True), seed=pid).chosen[0].index
        for pid in range(1000, 1064)
    }
    assert len(firsts) >= 4, "concurrent pickers should spread over equal GPUs"
    assert choose(equal, Request(allow_busy=True), seed=7) == choose(
        equal, Request(allow_busy=True), seed=7
    )


def test_request_round_trips_through_a_waiting_ticket() -> None:
    request = Request(
        count=2,
        min_free_bytes=GIB,
        max_util_pct=50.0,
        mem_bytes=3,
        strategy=Strategy.PACK,
        allowed=frozenset({1, 2}),
        excluded=frozenset({0}),
    )
    assert request_from_record(request_record(request)) == request


@pytest.mark.parametrize(
    "changes",
    [
        {"count": 0},
        {"count": 10**400},
        {"count": True},
        {"min_free_bytes": -1},
        {"min_free_bytes": 10**400},
        {"mem_bytes": 1.5},
        {"max_util_pct": float("nan")},
        {"max_util_pct": float("inf")},
        {"max_util_pct": 100.5},
        {"strategy": ["pack"]},
        {"strategy": "fastest"},
        {"allowed": [-1]},
        {"excluded": [2**70]},
        {"excluded": "0"},
    ],
    ids=lambda changes: "-".join(f"{k}={v!r}"[:30] for k, v in changes.items()),
)
def test_a_ticket_request_out_of_range_is_refused(changes: dict[str, object]) -> None:
    # GIVEN a ticket's request as another user may write it
    with pytest.raises(ValueError, match="not a"):
        request_from_record({**request_record(Request(count=2)), **changes})


@pytest.mark.parametrize(
    "record",
    [None, [], "count=1", {}, {"strategy": "pack"}],
    ids=["null", "list", "text", "empty", "no-count"],
)
def test_a_ticket_whose_request_is_no_request_is_refused(record: object) -> None:
    # GIVEN a ticket whose request is not an object with a count, as a forger may write it
    # WHEN it is read THEN it is refused as malformed, not a crash of the reader
    with pytest.raises(ValueError, match="not a request"):
        request_from_record(record)


def test_a_jobs_own_leases_are_its_to_use_but_not_a_waiters() -> None:
    # GIVEN GPU 3 leased by a job, and another job waiting ahead for any GPU
    own = Lease("GPU-3", 3, 4242, "alice", "python train.py", 0.0, None, lease_id="L1")
    ahead = (Waiter(100, "bob", Request()),)
    # WHEN a worker of that job asks (it holds L1 through its parent)
    choice = choose(
        FOUR,
        Request(allowed=frozenset({3})),
        leases=[own],
        mine=frozenset({"L1"}),
        waiting_ahead=ahead,
    )
    # THEN it gets its parent's GPU, and the waiter is kept to the others
    assert [g.index for g in choice.chosen] == [3]
    stranger = choose(FOUR, Request(allowed=frozenset({3})), leases=[own], waiting_ahead=ahead)
    assert "GPU 3: leased by pid 4242 (alice)" in stranger.reasons


def idle(index: int, **fields: object) -> GpuSample:
    """A GPU nobody uses: 300 MiB of the driver's and nothing else."""
    return gpu(index, 80 - 0.3, util=0, memory_used_bytes=0, **fields)


def process(
    pid: int, gpu_index: int, user: str, gib: float, kind: ProcessKind = ProcessKind.COMPUTE
) -> ProcessUsage:
    return ProcessUsage(pid, gpu_index, f"GPU-{gpu_index}", int(gib * GIB), kind, user=user)


class TestGpusInUse:
    """Without --mem, a job gets only GPUs nobody uses."""

    @pytest.mark.parametrize(
        ("busy", "processes", "reason"),
        [
            (
                gpu(1, 44, util=48, memory_used_bytes=36 * GIB),
                (process(40500, 1, "svc-infer", 18), process(40501, 1, "svc-infer", 18)),
                "GPU 1: in use by svc-infer, pids 40500 40501, 36.0GiB used, 48% busy",
            ),
            (
                gpu(1, 74, util=0, memory_used_bytes=6 * GIB),
                (process(40200, 1, "bob", 6),),
                "GPU 1: in use by bob, pid 40200, 6.0GiB used, 0% busy",
            ),
            (
                gpu(1, 79, util=0, memory_used_bytes=GIB),
                (process(900, 1, "root", 1, ProcessKind.GRAPHICS),),
                "GPU 1: in use by root, pid 900, 1.0GiB used, 0% busy",
            ),
            (
                gpu(1, 77, util=0, memory_used_bytes=3 * GIB),
                (),
                "GPU 1: in use: 3.0GiB used > 1.0GiB (default; see --max-used)",
            ),
            (
                gpu(1, 79.7, util=30, memory_used_bytes=0),
                (),
                "GPU 1: in use: 30% busy > 5% (default; see --max-util)",
            ),
        ],
        ids=["two-processes", "idle-process", "big-graphics", "memory-no-process", "busy"],
    )
    def test_a_gpu_in_use_is_never_given_and_says_by_whom(
        self, busy: GpuSample, processes: tuple[ProcessUsage, ...], reason: str
    ) -> None:
        # GIVEN an idle GPU 0 and GPU 1 in use
        snapshot = node(idle(0), busy, processes=processes)
        # WHEN two GPUs are asked for THEN none are given, and GPU 1 says why
        choice = choose(snapshot, Request(count=2))
        assert not choice.satisfied and choice.in_use == 1
        assert reason in choice.reasons
        # AND one GPU is GPU 0, whatever GPU 1's free memory
        assert [g.index for g in choose(snapshot, Request()).chosen] == [0]

    def test_a_process_whose_user_is_unknown_is_named_by_its_pid(self) -> None:
        # GIVEN a process of another PID namespace (no user), as the driver lists it
        stranger = ProcessUsage(7, 0, "GPU-0", 6 * GIB, ProcessKind.COMPUTE)
        snapshot = node(gpu(0, 74, util=0, memory_used_bytes=6 * GIB), processes=(stranger,))
        choice = choose(snapshot, Request())
        assert choice.reasons == ("GPU 0: in use by pid 7, 6.0GiB used, 0% busy",)

    def test_a_small_graphics_process_does_not_count(self) -> None:
        xorg = process(900, 0, "root", 0.1, ProcessKind.GRAPHICS)
        snapshot = node(gpu(0, 79.6, util=1, memory_used_bytes=GIB // 10), processes=(xorg,))
        assert choose(snapshot, Request()).satisfied

    def test_recent_utilization_counts_when_known(self) -> None:
        snapshot = node(idle(0))
        choice = choose(snapshot, Request(), recent_util_pct={"GPU-0": 40.0})
        assert choice.reasons == (
            "GPU 0: in use: 40% busy in the last minute > 5% (default; see --max-util)",
        )

    @pytest.mark.parametrize(
        "request_",
        [
            Request(allow_busy=True),
            Request(mem_bytes=10 * GIB),
            Request(max_util_pct=50, max_used_bytes=8 * GIB, allow_busy=True),
        ],
        ids=["allow-busy", "mem-shares", "limits-raised"],
    )
    def test_options_take_gpus_in_use(self, request_: Request) -> None:
        # GIVEN a GPU bob computes on, with 6 GiB used and 30 % busy
        snapshot = node(
            gpu(0, 74, util=30, memory_used_bytes=6 * GIB), processes=(process(7, 0, "bob", 6),)
        )
        assert choose(snapshot, request_).satisfied

    def test_raised_limits_alone_still_refuse_another_jobs_process(self) -> None:
        snapshot = node(
            gpu(0, 74, util=30, memory_used_bytes=6 * GIB), processes=(process(7, 0, "bob", 6),)
        )
        choice = choose(snapshot, Request(max_util_pct=50, max_used_bytes=8 * GIB))
        assert choice.reasons == ("GPU 0: in use by bob, pid 7, 6.0GiB used, 30% busy",)
        assert (
            "max-used" in choose(snapshot, Request(max_used_bytes=GIB, allow_busy=True)).reasons[0]
        )

    def test_the_jobs_own_processes_do_not_make_its_gpus_in_use(self) -> None:
        # GIVEN GPU 0 used by a worker (pid 7) of the asking job, and GPU 1 leased to it alone
        worker = process(7, 0, "alice", 20)
        snapshot = node(
            gpu(0, 60, util=90, memory_used_bytes=20 * GIB),
            gpu(1, 60, util=90, memory_used_bytes=20 * GIB),
            processes=(worker,),
        )
        own = Lease("GPU-1", 1, 4242, "alice", "torchrun", 0.0, None, lease_id="L1")
        choice = choose(
            snapshot,
            Request(count=2),
            leases=[own],
            mine=frozenset({"L1"}),
            own_pids=frozenset({7}),
        )
        assert sorted(g.index for g in choice.chosen) == [0, 1]
        # AND to anyone else both are in use (GPU 1 leased besides)
        assert not choose(snapshot, Request()).satisfied


class TestImpossibleMemoryFigures:
    @pytest.mark.parametrize(
        ("fields", "reason"),
        [
            (
                {"memory_used_bytes": 100 * GIB, "memory_free_bytes": 2**64 - 20 * GIB},
                "GPU 0: free memory unknown (the driver reports 16777216.0TiB free of 80.0GiB)",
            ),
            (
                {"memory_used_bytes": 100 * GIB, "memory_free_bytes": 10 * GIB},
                "GPU 0: free memory unknown (the driver reports 100.0GiB used of 80.0GiB)",
            ),
        ],
        ids=["free-above-total", "used-above-total"],
    )
    def test_a_gpu_with_more_than_exists_is_never_chosen(
        self, fields: dict[str, int], reason: str
    ) -> None:
        snapshot = node(gpu(0, 0, **fields), idle(1))
        for request_ in (Request(), Request(allow_busy=True, min_free_bytes=70 * GIB)):
            choice = choose(snapshot, request_)
            assert [g.index for g in choice.chosen] == [1]
            assert choice.reasons == (reason,)

    def test_two_gpus_with_one_uuid_are_both_in_error(self) -> None:
        snapshot = node(idle(0), idle(1, uuid="GPU-0"), idle(2))
        choice = choose(snapshot, Request(count=2))
        assert not choice.satisfied
        assert choice.reasons[:2] == (
            "GPU 0: error: the driver reports the same UUID for GPU 1",
            "GPU 1: error: the driver reports the same UUID for GPU 0",
        )


def test_a_request_with_the_new_limits_round_trips_and_old_tickets_still_read() -> None:
    request = Request(max_used_bytes=2 * GIB, allow_busy=True)
    assert request_from_record(request_record(request)) == request
    newer = ("allow_busy", "max_used_bytes")
    old = {k: v for k, v in request_record(Request()).items() if k not in newer}
    assert request_from_record(old) == Request()
    with pytest.raises(ValueError, match="not a"):
        request_from_record({**request_record(Request()), "allow_busy": "yes"})
