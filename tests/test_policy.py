"""The selection policy: which GPUs a job gets, and why the others are refused."""

from __future__ import annotations

import pytest

from gpuwatch.models import GpuSample, Lease, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.policy import KEEP_LIMIT_S, Request, Strategy, Waiter, choose

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
        (Request(), [3]),
        (Request(count=2), [3, 1]),
        (Request(count=2, strategy=Strategy.LEAST_UTIL), [2, 1]),
        (Request(strategy=Strategy.PACK, min_free_bytes=30 * GIB), [2]),
        (Request(strategy=Strategy.PACK, mem_bytes=5 * GIB), [0]),
        (Request(max_util_pct=50), [1]),
        (Request(count=2, min_free_bytes=50 * GIB, max_util_pct=70), [3, 1]),
        (Request(allowed=frozenset({0, 2})), [2]),
        (Request(excluded=frozenset({3, 1})), [2]),
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
        (Request(min_free_bytes=50 * GIB), (), "GPU 2: 40.0GiB free < 50.0GiB"),
        (Request(max_util_pct=10), (), "GPU 1: 20% busy > 10%"),
        (Request(), (lease(2, 4242, "alice"),), "GPU 2: leased by pid 4242 (alice)"),
        (
            Request(),
            (lease(2, 7, "bob", mem_gib=5), lease(2, 8, "eve", mem_gib=5)),
            "GPU 2: shared by pid 7 (bob) and 1 more",
        ),
        (Request(mem_bytes=GIB), (lease(2, 9, "carol"),), "GPU 2: leased by pid 9 (carol)"),
        (Request(allowed=frozenset({0})), (), "GPU 2: not in CUDA_VISIBLE_DEVICES"),
        (Request(excluded=frozenset({2})), (), "GPU 2: excluded"),
        (
            Request(mem_bytes=35 * GIB),
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
    return {name: getattr(request, name) for name in Request.__dataclass_fields__}


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (gpu(0, 70, error="GPU is lost", memory_free_bytes=None), "GPU 0: error: GPU is lost"),
        (gpu(0, 70, memory_free_bytes=None), "GPU 0: free memory unknown"),
    ],
    ids=["lost", "free-unknown"],
)
def test_faulty_or_unknown_gpus_are_never_chosen(broken: GpuSample, reason: str) -> None:
    choice = choose(node(broken, gpu(1, 5)), Request())
    assert [g.index for g in choice.chosen] == [1]
    assert choice.reasons == (reason,)


def test_unknown_utilization_fails_a_utilization_limit_only() -> None:
    quiet = gpu(0, 70, utilization_pct=None)
    assert choose(node(quiet), Request()).satisfied
    assert choose(node(quiet), Request(max_util_pct=50)).reasons == ("GPU 0: utilization unknown",)


def test_not_enough_lists_every_gpu_including_those_that_qualify() -> None:
    choice = choose(FOUR, Request(count=2, min_free_bytes=72 * GIB))
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
        assert choose(gpus, Request(mem_bytes=10 * GIB), leases=holders).satisfied
        assert not choose(gpus, Request(mem_bytes=11 * GIB), leases=holders).satisfied

    def test_memory_a_holder_already_uses_is_not_promised_twice(self) -> None:
        # GIVEN a holder that declared 30 GiB and already allocated 25 of them
        holder_process = ProcessUsage(1, 0, "GPU-0", 25 * GIB, ProcessKind.COMPUTE)
        gpus = node(gpu(0, 45), processes=(holder_process,))
        # THEN only the 5 GiB it has not allocated yet are held back
        choice = choose(gpus, Request(mem_bytes=40 * GIB), leases=(lease(0, 1, mem_gib=30),))
        assert choice.satisfied

    def test_an_exclusive_lease_keeps_shared_jobs_out(self) -> None:
        choice = choose(node(gpu(0, 70)), Request(mem_bytes=GIB), leases=(lease(0),))
        assert not choice.satisfied


class TestWaitingInLine:
    def test_gpus_an_earlier_waiter_can_use_are_kept_for_it(self) -> None:
        earlier = Waiter(100, "alice", Request(min_free_bytes=60 * GIB))
        choice = choose(FOUR, Request(count=4), waiting_ahead=(earlier,))
        assert "GPU 3: kept for pid 100 (alice), which asked earlier" in choice.reasons
        assert choose(FOUR, Request(), waiting_ahead=(earlier,)).chosen[0].index == 1

    def test_gpus_no_earlier_waiter_can_use_stay_available(self) -> None:
        earlier = Waiter(100, "alice", Request(count=3, min_free_bytes=60 * GIB))
        choice = choose(FOUR, Request(count=2), waiting_ahead=(earlier,))
        assert [g.index for g in choice.chosen] == [2, 0]

    def test_later_waiters_queue_behind_earlier_ones(self) -> None:
        line = (Waiter(1, "a", Request()), Waiter(2, "b", Request()))
        choice = choose(FOUR, Request(count=3), waiting_ahead=line)
        assert [g.index for g in choice.chosen] == []
        assert choose(FOUR, Request(count=2), waiting_ahead=line).chosen[0].index == 2

    @pytest.mark.parametrize(
        ("waited_s", "kept"),
        [(0.0, True), (KEEP_LIMIT_S - 1, True), (KEEP_LIMIT_S + 1, False)],
        ids=["just-arrived", "nearly-at-the-limit", "past-the-limit"],
    )
    def test_a_waiter_keeps_gpus_for_a_limited_time(self, waited_s: float, kept: bool) -> None:
        # GIVEN a job waiting for every GPU of the node
        earlier = Waiter(100, "alice", Request(count=4), waited_s=waited_s)
        # THEN later jobs are kept off the GPUs, but not forever
        assert choose(FOUR, Request(), waiting_ahead=(earlier,)).satisfied is not kept

    @pytest.mark.parametrize(
        ("users", "satisfied"),
        [(("alice", "alice", "alice"), True), (("alice", "bob", "carol"), False)],
        ids=["one-user", "three-users"],
    )
    def test_only_each_users_first_waiter_keeps_gpus(
        self, users: tuple[str, ...], satisfied: bool
    ) -> None:
        # GIVEN three jobs waiting for one GPU each
        line = tuple(Waiter(100 + n, user, Request()) for n, user in enumerate(users))
        # THEN one user's queue keeps one GPU, three users' queues keep three
        assert choose(FOUR, Request(count=2), waiting_ahead=line).satisfied is satisfied

    @pytest.mark.parametrize(
        "impossible",
        [
            Request(count=5),
            Request(min_free_bytes=81 * GIB),
            Request(mem_bytes=81 * GIB),
            Request(allowed=frozenset({7})),
            Request(count=2, excluded=frozenset({0, 1, 2})),
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
        assert choose(FOUR, Request(count=4), waiting_ahead=(earlier,)).satisfied


def test_ties_between_equal_gpus_are_broken_differently_by_different_pickers() -> None:
    equal = node(*(gpu(i, 80) for i in range(8)))
    firsts = {choose(equal, Request(), seed=pid).chosen[0].index for pid in range(1000, 1064)}
    assert len(firsts) >= 4, "concurrent pickers should spread over equal GPUs"
    assert choose(equal, Request(), seed=7) == choose(equal, Request(), seed=7)


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
    assert Request.from_dict(request.to_dict()) == request


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
        Request.from_dict({**Request(count=2).to_dict(), **changes})


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
