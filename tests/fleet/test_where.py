"""`where`: the placement rules run on every node of a fleet, against an answer computed
here by a rule written independently of gpuwatch's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpuwatch.choices import Strategy
from gpuwatch.fleet.mapped import GpuFields
from gpuwatch.fleet_model import Exporter, FleetState, GpuPod, NodeState, NodeSummary
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.placement.where import explained, where
from gpuwatch.request import Request
from tests.helpers.fleet.nodes import idle_gpu_node

GIB = 1 << 30
TOTAL = 80 * GIB


@dataclass(frozen=True)
class Gpu:
    """One GPU as the test draws it: whole GiB only, so that equal is equal to the rules too."""

    free_gib: int | None
    util_pct: int | None
    lease: str | None  # None, "exclusive" or "shared"
    declared_gib: int
    process: bool  # another job's compute process runs there
    mig: bool


@dataclass(frozen=True)
class Node:
    name: str
    up: bool
    gpus: tuple[Gpu, ...]
    gpuwatch: bool  # leases known


_gpus = st.builds(
    Gpu,
    free_gib=st.one_of(st.none(), st.integers(0, 80)),
    util_pct=st.one_of(st.none(), st.integers(0, 100)),
    lease=st.sampled_from([None, None, "exclusive", "shared"]),
    declared_gib=st.integers(1, 30),
    process=st.booleans(),
    mig=st.sampled_from([False, False, False, True]),
)
_nodes = st.lists(
    st.builds(
        Node,
        name=st.from_regex(r"n[0-9]{1,2}", fullmatch=True),
        up=st.sampled_from([True, True, True, False]),
        gpus=st.lists(_gpus, min_size=1, max_size=4).map(tuple),
        gpuwatch=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda node: node.name,
)


def fleet_of(nodes: list[Node]) -> FleetState:
    return FleetState(
        taken_at=1000.0,
        source="test",
        nodes=tuple(sorted((_state(node) for node in nodes), key=lambda n: n.name)),
    )


def _state(node: Node) -> NodeState:
    gpus, processes, leases = [], [], []
    for index, gpu in enumerate(node.gpus):
        uuid = f"GPU-{node.name}-{index}"
        free = None if gpu.free_gib is None else gpu.free_gib * GIB
        gpus.append(
            GpuSample(
                index,
                uuid,
                "H100",
                None,
                memory_total_bytes=TOTAL,
                memory_free_bytes=free,
                memory_used_bytes=None if free is None else TOTAL - free,
                utilization_pct=gpu.util_pct,
                mig_enabled=gpu.mig,
            )
        )
        if gpu.process:
            processes.append(ProcessUsage(900 + index, index, uuid, GIB, ProcessKind.COMPUTE))
        if gpu.lease is not None:
            declared = None if gpu.lease == "exclusive" else gpu.declared_gib * GIB
            leases.append(Lease(uuid, index, 0, "", "", 0.0, declared, f"{node.name}-{index}"))
    snapshot = Snapshot(1000.0, node.name, None, None, tuple(gpus), tuple(processes))
    return NodeState(
        name=node.name,
        up=node.up,
        snapshot=snapshot,
        data_at=999.0 if node.up else 880.0,  # 1 s or 120 s before the fleet's 1000.0
        error=None if node.up else "stale",
        exporter=Exporter.GPUWATCH if node.gpuwatch else Exporter.DCGM,
        leases=tuple(leases) if node.gpuwatch else None,
    )


def expected_free(node: Node, count: int, min_free_gib: int, mem_gib: int | None) -> int | None:
    """The free GiB of the `count` best GPUs of `node` for the request, or None when fewer
    qualify: the rule as the docs state it, written from them, not from the code."""
    if not node.up:
        return None
    usable = []
    for gpu in node.gpus:
        if gpu.mig or gpu.free_gib is None:
            continue
        lease = gpu.lease if node.gpuwatch else None
        promised = gpu.declared_gib if lease == "shared" else 0  # holder pid 0 has used none
        free = gpu.free_gib - promised
        if mem_gib is None:  # exclusive: no lease, no other process, little used, not busy
            busy = gpu.util_pct is not None and gpu.util_pct > 5
            if lease or gpu.process or 80 - gpu.free_gib > 1 or busy:
                continue
        elif lease == "exclusive":
            continue
        if free >= max(min_free_gib, mem_gib or 0):
            usable.append(free)
    if len(usable) < count:
        return None
    return sum(sorted(usable, reverse=True)[:count])


@settings(max_examples=150, deadline=None)
@given(
    nodes=_nodes,
    count=st.integers(1, 3),
    min_free_gib=st.sampled_from([0, 10, 40, 79]),
    mem_gib=st.sampled_from([None, None, 5, 20]),
)
def test_where_agrees_with_an_independent_reading_of_the_rules(
    nodes: list[Node], count: int, min_free_gib: int, mem_gib: int | None
) -> None:
    # GIVEN any fleet WHEN where is asked for COUNT GPUs with MIN_FREE free (exclusive, or
    # shared with MEM declared)
    request = Request(
        count=count,
        min_free_bytes=min_free_gib * GIB,
        mem_bytes=None if mem_gib is None else mem_gib * GIB,
    )
    answer = where(fleet_of(nodes), request)
    # THEN exactly the nodes the rule admits fit, most free memory first, ties by name
    expected = {
        node.name: free
        for node in nodes
        if (free := expected_free(node, count, min_free_gib, mem_gib)) is not None
    }
    order = sorted(expected, key=lambda name: (-expected[name], name))
    assert [fit.node for fit in answer.fits] == order
    for fit in answer.fits:
        assert len(fit.devices) == count
        assert fit.memory_free_bytes == expected[fit.node] * GIB
    assert {miss.node for miss in answer.misses} == {n.name for n in nodes} - set(expected)


@settings(max_examples=100, deadline=None)
@given(nodes=_nodes, count=st.integers(1, 3), min_free_gib=st.sampled_from([0, 40, 79]))
def test_where_without_reasons_answers_alike_and_explains_the_misses_it_shows(
    nodes: list[Node], count: int, min_free_gib: int
) -> None:
    # GIVEN any fleet and request
    fleet, request = fleet_of(nodes), Request(count=count, min_free_bytes=min_free_gib * GIB)
    # WHEN where answers without its devices' reasons (as the command asks it), and the
    # misses it shows are explained afterwards
    explaining = where(fleet, request)
    lean = where(fleet, request, explain=False)
    # THEN the fits and misses, in order, and each miss's summary are those of an answer
    # with reasons; a miss carries no device's reason until explained, and then its own
    assert lean.fits == explaining.fits
    assert [replace(miss, reasons=()) for miss in explaining.misses] == [
        replace(miss, reasons=()) for miss in lean.misses
    ]
    assert not any(miss.reasons for miss in lean.misses)
    assert explained(fleet, request, lean.misses) == explaining.misses


def _two_node_fleet() -> FleetState:
    roomy = Node("big", True, (Gpu(79, 0, None, 1, False, False),) * 2, True)
    tight = Node("small", True, (Gpu(45, 0, None, 1, False, False),) * 2, True)
    return fleet_of([roomy, tight])


@pytest.mark.parametrize(
    ("strategy", "order"),
    [(Strategy.MOST_FREE, ["big", "small"]), (Strategy.PACK, ["small", "big"])],
    ids=["most-free", "pack"],
)
def test_strategy_orders_nodes(strategy: Strategy, order: list[str]) -> None:
    request = Request(count=2, min_free_bytes=40 * GIB, strategy=strategy, allow_busy=True)
    answer = where(_two_node_fleet(), request)
    assert [fit.node for fit in answer.fits] == order


def test_excluded_nodes_are_left_out() -> None:
    answer = where(_two_node_fleet(), Request(allow_busy=True), excluded_nodes={"big"})
    assert [fit.node for fit in answer.fits] == ["small"]
    assert "big" not in {miss.node for miss in answer.misses}


def test_a_down_node_is_explained_with_its_age_and_never_fits() -> None:
    # GIVEN a node whose data is two minutes old, with idle GPUs
    down = Node("old", False, (Gpu(79, 0, None, 1, False, False),), True)
    # WHEN any GPU is asked for THEN it does not fit, and the reason gives its age
    answer = where(fleet_of([down]), Request())
    assert answer.fits == ()
    assert answer.misses[0].summary == "down: stale, data 2m old"


def test_misses_explain_each_gpu_and_the_closest_come_first() -> None:
    # GIVEN one node with 1 idle GPU of 2, and one with none
    one = Node(
        "one", True, (Gpu(79, 0, None, 1, False, False), Gpu(79, 90, None, 1, True, False)), True
    )
    none = Node("none", True, (Gpu(79, 0, "exclusive", 1, False, False),), True)
    # WHEN two GPUs are asked for
    answer = where(fleet_of([none, one]), Request(count=2))
    # THEN the closer node comes first, with pick's reasons per GPU
    assert [miss.node for miss in answer.misses] == ["one", "none"]
    assert answer.misses[0].summary == "1 of 2 qualify"
    assert answer.misses[0].reasons[0].startswith("GPU 0: qualifies")
    assert answer.misses[0].reasons[1].startswith("GPU 1: in use by pid 901")
    # (a lease seen in a node's metrics has no pid or user to name)
    assert answer.misses[1].reasons == ("GPU 0: leased",)


def test_a_mig_request_runs_the_mig_rules_on_each_node() -> None:
    # GIVEN a node with a MIG-enabled GPU split into a free 1g.10gb
    gpu = GpuSample(0, "GPU-m", "A100", None, memory_total_bytes=TOTAL, mig_enabled=True)
    device = MigDevice(
        0,
        0,
        "MIG-a",
        profile="1g.10gb",
        memory_total_bytes=10 * GIB,
        memory_used_bytes=0,
        memory_free_bytes=10 * GIB,
    )
    snapshot = Snapshot(1000.0, "m", None, None, (gpu,), (), (device,))
    node = NodeState("m", True, snapshot, 1.0, exporter=Exporter.GPUWATCH, leases=())
    fleet = FleetState(1000.0, "test", (node,))
    # WHEN a whole GPU is asked for THEN it does not fit; a MIG device does
    assert where(fleet, Request()).fits == ()
    fits = where(fleet, Request(mig="1g.10gb")).fits
    assert [(fit.node, [d.uuid for d in fit.devices]) for fit in fits] == [("m", ["MIG-a"])]


@pytest.mark.parametrize(
    ("age_s", "shown"),
    [(14.9689, "14s"), (3600.0, "1h00m"), (90061.0, "1d01h")],
    ids=["seconds", "hour", "day"],
)
def test_a_down_nodes_age_reads_as_a_human_duration(age_s: float, shown: str) -> None:
    # GIVEN a node down with data 14968.9 ms, an hour, a day old
    now = 1_795_472_800.0
    node = NodeState("old", False, None, now - age_s, "connection refused")
    # WHEN where explains it THEN its age reads as a duration, never in milliseconds
    (miss,) = where(FleetState(now, "test", (node,)), Request()).misses
    assert miss.summary == f"down: connection refused, data {shown} old"


def test_two_targets_claiming_one_name_are_named_apart_and_excluded_together() -> None:
    # GIVEN two targets that name themselves gpu-07, and another node
    twins = [idle_gpu_node("gpu-07", f"10.0.0.{n}:9400", claims=2) for n in (7, 66)]
    fleet = FleetState(0.0, "test", (*twins, idle_gpu_node("gpu-08", "10.0.0.8:9400")))
    # WHEN where is asked THEN each twin is named by its target
    fits = [fit.node for fit in where(fleet, Request()).fits]
    assert fits == ["gpu-07@10.0.0.66:9400", "gpu-07@10.0.0.7:9400", "gpu-08"]
    # AND one is left out by its label, both by their name
    one = where(fleet, Request(), excluded_nodes={"gpu-07@10.0.0.66:9400"})
    assert [fit.node for fit in one.fits] == ["gpu-07@10.0.0.7:9400", "gpu-08"]
    both = where(fleet, Request(), excluded_nodes={"gpu-07"})
    assert [fit.node for fit in both.fits] == ["gpu-08"]


def test_a_gpu_a_pod_holds_is_never_given() -> None:
    # GIVEN a node of two idle GPUs, the first held by a Kubernetes pod
    pod = GpuPod(0, "ml", "train-0", "main")
    node = idle_gpu_node("k8s-1", pods=(pod,))
    # WHEN two GPUs, or one, are asked for
    two = where(FleetState(0.0, "t", (node,)), Request(count=2, allow_busy=True))
    one = where(FleetState(0.0, "t", (node,)), Request(allow_busy=True))
    # THEN the pod's GPU is never given, and the reason names the pod
    assert two.fits == ()
    assert two.misses[0].reasons[0] == "GPU 0: held by pod ml/train-0 (container main)"
    assert [d.index for d in one.fits[0].devices] == [1]


def test_a_gpu_reporting_no_memory_at_all_is_not_offered_with_0b_free() -> None:
    # GIVEN a GPU whose exporter says 0 used and 0 free (read as unknown)
    fields = GpuFields(3, {"uuid": "GPU-z", "memory_used_bytes": 0, "memory_free_bytes": 0})
    gpu = fields.build()
    snapshot = Snapshot(1000.0, "z", None, None, (gpu,), ())
    node = NodeState("z", True, snapshot, 1.0, exporter=Exporter.DCGM)
    # WHEN where is asked for any GPU THEN it is not offered: its free memory is unknown
    answer = where(FleetState(0.0, "t", (node,)), Request(allow_busy=True))
    assert answer.fits == ()
    assert answer.misses[0].reasons == ("GPU 3: free memory unknown",)


def test_a_node_read_by_its_daemons_verdict_says_why_it_falls_short() -> None:
    # GIVEN a node whose daemon would give out 1 of its 8 GPUs
    gpu = GpuSample(5, "GPU-v", None, None, memory_free_bytes=70 * GIB, utilization_pct=0)
    snapshot = Snapshot(1000.0, "v", None, None, (gpu,), ())
    summary = NodeSummary(8, 1, None, None, None, None, None, None, None)
    node = NodeState("v", True, None, 1.0, leases=(), summary=summary, offered=snapshot)
    fleet = FleetState(0.0, "t", (node,))
    # WHEN two GPUs, or nine, are asked for
    (two,) = where(fleet, Request(count=2, min_free_bytes=40 * GIB)).misses
    (nine,) = where(fleet, Request(count=9)).misses
    # THEN it says how many qualify and that its daemon gives out no more; never for nine
    assert (two.summary, two.qualifying) == ("1 of 2 qualify", 1)
    assert two.reasons[0].startswith("its other 7 GPUs: not given out by its daemon")
    assert "less than 40.0GiB free" in two.reasons[0]
    assert nine.summary == "never: it has 8 GPUs"


def test_mig_devices_an_exporter_does_not_tell_are_unknown() -> None:
    # GIVEN a node whose exporter says GPU 0 is MIG-enabled and tells no MIG device
    gpu = GpuSample(0, "GPU-m", "H100", None, memory_free_bytes=TOTAL, mig_enabled=True)
    snapshot = Snapshot(1000.0, "m", None, None, (gpu,), ())
    node = NodeState("m", True, snapshot, 1.0, mig_devices_known=False)
    # WHEN a MIG device is asked for THEN the node's MIG devices are unknown, not none
    (miss,) = where(FleetState(0.0, "t", (node,)), Request(mig="any")).misses
    assert miss.summary == (
        "MIG devices unknown: GPU 0 MIG-enabled, but its exporter does not tell its MIG devices"
    )
