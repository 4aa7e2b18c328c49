"""The fleet screen's pure parts: the simulated fleet, rows, totals, users, sort and filter,
the plain table and the JSON document, without a terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from gpuwatch.backends.sim_fleet import STALE_AGE_S, SimFleet
from gpuwatch.fleet.document import fleet_document
from gpuwatch.fleet_model import Exporter, FleetState, GpuJob, GpuPod, NodeState, NodeSummary
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.node_figures import leases_on, node_figures
from gpuwatch.tui.fleet import rows as fleet_rows
from gpuwatch.tui.fleet.cells import cell_text, columns_for, plain_table
from gpuwatch.tui.fleet.model import FleetView, NodeFilter
from gpuwatch.tui.fleet.rows import IdleTracker, NodeRow, build_rows, totals, user_rows
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.fleet.document import GPU_KEYS, NODE_KEYS
from tests.helpers.fleet.nodes import idle_gpu_node

GIB = 1 << 30


def gpu(index: int, *, used_gib: float = 0, util: int | None = 0, **extra: Any) -> GpuSample:
    total = 80 * GIB
    used = int(used_gib * GIB)
    fields: dict[str, Any] = {
        "memory_total_bytes": total,
        "memory_used_bytes": used,
        "memory_free_bytes": total - used,
        "utilization_pct": util,
        "temperature_c": 30 + (util or 0) // 2,
        "power_w": 70.0 + (util or 0),
        "mig_enabled": False,
    }
    fields.update(extra)
    return GpuSample(index, f"GPU-{index:08d}", "NVIDIA H100 80GB HBM3", None, **fields)


def process(gpu_index: int, user: str, used_gib: float, pid: int = 7) -> ProcessUsage:
    return ProcessUsage(
        pid, gpu_index, f"GPU-{gpu_index:08d}", int(used_gib * GIB), ProcessKind.COMPUTE, user
    )


def exclusive(gpu_index: int) -> Lease:
    return Lease(f"GPU-{gpu_index:08d}", gpu_index, 0, "", "", 0.0, lease_id=f"l{gpu_index}")


def node(
    name: str,
    gpus: tuple[GpuSample, ...],
    processes: tuple[ProcessUsage, ...] = (),
    leases: tuple[Lease, ...] | None = (),
    *,
    up: bool = True,
    exporter: Exporter = Exporter.GPUWATCH,
) -> NodeState:
    snapshot = Snapshot(FROZEN_TIME, name, None, None, gpus, processes)
    error = None if up else "no new data for 5 min"
    return NodeState(name, up, snapshot, FROZEN_TIME - 2.0, error, exporter, leases)


def fleet(*nodes: NodeState) -> FleetState:
    return FleetState(FROZEN_TIME, "test", tuple(sorted(nodes, key=lambda n: n.name)))


DOWN = NodeState("gone", False, None, None, "connection refused", Exporter.GPUWATCH, None)
MIXED = fleet(
    node(
        "alpha",
        (gpu(0), gpu(1), gpu(2, used_gib=60, util=90), gpu(3, util=None, used_gib=0.5)),
        (process(2, "alice", 60),),
        (exclusive(1),),
    ),
    node("beta", (gpu(0, used_gib=10, util=40), gpu(1)), (), None, exporter=Exporter.DCGM),
    node("stale", (gpu(0), gpu(1)), up=False),
    DOWN,
)


# --- the simulated fleet --------------------------------------------------------------------


def test_a_simulated_fleet_is_the_same_at_the_same_moment_and_drifts_as_time_runs() -> None:
    # GIVEN two simulated fleets of one seed, and a clock we move
    now = [FROZEN_TIME]
    first, second = SimFleet(20, clock=lambda: now[0]), SimFleet(20, clock=lambda: now[0])
    # WHEN both are read at one moment THEN they agree, node for node
    assert first.read() == second.read()
    before = first.read()
    # AND a minute later the utilizations have moved
    now[0] += 60
    after = first.read()

    def utilizations(state: FleetState) -> list[int | None]:
        return [g.utilization_pct for n in state.nodes if n.snapshot for g in n.snapshot.gpus]

    assert utilizations(before) != utilizations(after)


def test_a_simulated_fleet_has_named_nodes_some_down_stale_and_one_of_another_exporter() -> None:
    state = SimFleet(20, clock=lambda: FROZEN_TIME).read()
    names = [n.name for n in state.nodes]
    assert names == [f"node-{k:02d}" for k in range(1, 21)]
    down = [n for n in state.nodes if not n.up and n.snapshot is None]
    stale = [n for n in state.nodes if not n.up and n.snapshot is not None]
    assert down and all(n.error for n in down)
    assert stale and all(n.age_at(state.taken_at) == STALE_AGE_S for n in stale)
    others = [n for n in state.nodes if n.exporter is Exporter.DCGM]
    assert len(others) == 1 and others[0].leases is None and not others[0].snapshot.processes  # type: ignore[union-attr]
    uuids = [g.uuid for n in state.nodes if n.snapshot for g in n.snapshot.gpus]
    assert len(uuids) == len(set(uuids)), "every GPU of the fleet has its own UUID"


@pytest.mark.parametrize("count", [1, 3], ids=["one-node", "three-nodes"])
def test_a_small_simulated_fleet_is_all_up(count: int) -> None:
    state = SimFleet(count, clock=lambda: FROZEN_TIME).read()
    assert len(state.nodes) == count and all(n.up for n in state.nodes)


def test_the_simulated_history_covers_the_window_for_every_gpu() -> None:
    source = SimFleet(3, clock=lambda: FROZEN_TIME)
    series = source.history("node-01", duration_s=600, points=60)
    state = source.read()
    assert len(series) == len(state.nodes[0].snapshot.gpus)  # type: ignore[union-attr]
    assert all(len(s.utilization_pct) == 60 for s in series)
    assert series[0].taken_at[-1] - series[0].taken_at[0] == pytest.approx(600)
    assert source.history("no-such-node") == ()


# --- rows, totals, users --------------------------------------------------------------------


def test_free_gpus_are_those_a_plain_pick_would_take() -> None:
    # GIVEN alpha: GPU 0 idle, 1 leased, 2 busy with alice's job, 3 idle of unknown utilization
    rows = {row.node: row for row in build_rows(MIXED)}
    # THEN GPUs 0 and 3 are free there (pick's rule: no lease, no process, ≤1 GiB, ≤5%)
    assert rows["alpha"].gpus_free == 2 and rows["alpha"].gpus == 4
    # AND on a dcgm node the rule runs on memory and utilization alone
    assert rows["beta"].gpus_free == 1
    # AND a stale or down node has nothing free, even idle GPUs
    assert rows["stale"].gpus_free is None and rows["gone"].gpus_free is None


def test_a_row_says_unknown_where_the_source_does_not_tell() -> None:
    rows = {row.node: row for row in build_rows(MIXED)}
    now = MIXED.taken_at
    assert cell_text(rows["beta"], "leases", now)[0] == "?"
    assert cell_text(rows["alpha"], "leases", now)[0] == "1"
    assert cell_text(rows["gone"], "free", now)[0] == "down"
    assert cell_text(rows["gone"], "age", now) == ("down", "alarm")
    assert cell_text(rows["stale"], "age", now) == ("2s stale", "alarm")
    assert cell_text(rows["alpha"], "most_free", now)[0] == "80.0GiB"


def test_an_up_nodes_age_moves_in_steps_and_a_stale_nodes_to_the_second() -> None:
    rows = {row.node: row for row in build_rows(MIXED)}
    alpha, stale = rows["alpha"], rows["stale"]

    def age(row: NodeRow, age_s: float) -> str:
        return cell_text(row, "age", FROZEN_TIME - 2.0 + age_s)[0]

    # a node that is up: the same cell from one scrape to the next
    assert age(alpha, 2.0) == age(alpha, 13.9) == "<15s"
    assert age(alpha, 31.0) == "30s"
    assert age(alpha, 125.0) == "2m"
    # a stale node: its age, marked, to the second
    assert age(stale, 301.0) == "5m stale"
    assert age(stale, 42.0) == "42s stale"


def test_free_gpus_follow_a_nodes_new_data_from_read_to_read() -> None:
    # GIVEN counts kept from read to read, and a first read
    counts = fleet_rows.RowMemory()
    first = build_rows(MIXED, memory=counts)
    assert first == build_rows(MIXED)
    # WHEN the next read has alpha's free GPU leased and beta's data unchanged
    alpha = next(n for n in MIXED.nodes if n.name == "alpha")
    leased = msgspec.structs.replace(alpha, leases=(exclusive(1), exclusive(0)))
    after = fleet(leased, *(n for n in MIXED.nodes if n.name != "alpha"))
    rows = {row.node: row for row in build_rows(after, memory=counts)}
    # THEN alpha has one GPU free fewer, beta the same, as counted afresh
    assert rows["alpha"].gpus_free == first[0].gpus_free - 1  # type: ignore[operator]
    assert list(rows.values()) == build_rows(after)


def test_a_row_read_as_figures_follows_its_users_from_read_to_read() -> None:
    # GIVEN a node read as its figures with one user, its rows kept from read to read
    summary = NodeSummary(8, 2, 40 << 30, 90 << 30, 12.5, 60, 900.0, 1, 0, (("ana", 1, 1 << 30),))
    read = NodeState("gamma", up=True, snapshot=None, data_at=FROZEN_TIME - 1.0, summary=summary)
    memory = fleet_rows.RowMemory()
    assert build_rows(fleet(read), memory=memory) == build_rows(fleet(read))
    # WHEN the next read has the same figures, and the one after another user too
    older = msgspec.structs.replace(read, data_at=FROZEN_TIME - 3.0)
    joined = (*summary.users, ("bo", 2, 2 << 30))
    busier = msgspec.structs.replace(older, summary=msgspec.structs.replace(summary, users=joined))
    # THEN the rows are those built afresh: the second user joins the row
    assert build_rows(fleet(older), memory=memory) == build_rows(fleet(older))
    assert build_rows(fleet(busier), memory=memory)[0].users == {"ana", "bo"}


def test_the_row_of_a_node_that_is_the_very_same_is_kept_and_shows_its_age_now() -> None:
    # GIVEN a node read as its figures, its row made at one read
    summary = NodeSummary(8, 2, 40 << 30, 90 << 30, 12.5, 60, 900.0, 1, 0, (("ana", 1, 1 << 30),))
    read = NodeState("gamma", up=True, snapshot=None, data_at=FROZEN_TIME - 1.0, summary=summary)
    memory = fleet_rows.RowMemory()
    (first,) = build_rows(fleet(read), memory=memory)
    # WHEN the next read, 40 s later, has the very same node, and the one after a new one
    later = FleetState(FROZEN_TIME + 40, "test", (read,))
    (kept,) = build_rows(later, memory=memory)
    scraped = msgspec.structs.replace(read, data_at=FROZEN_TIME + 39.0)
    (made,) = build_rows(FleetState(FROZEN_TIME + 40, "test", (scraped,)), memory=memory)
    # THEN the row is kept whole, its age shown at the read's time; a new node, a new row
    assert kept is first
    assert cell_text(kept, "age", later.taken_at)[0] == "30s"
    assert made is not first and made == build_rows(FleetState(0.0, "t", (scraped,)))[0]


def test_totals_count_the_gpus_of_nodes_that_are_up() -> None:
    result = totals(build_rows(MIXED))
    assert (result.nodes_up, result.nodes_down) == (2, 2)
    assert (result.gpus, result.gpus_free) == (6, 3)
    # utilization: the mean of every up node's known GPU utilizations, weighted by GPUs
    assert result.utilization_pct == pytest.approx((30 * 4 + 20 * 2) / 6)


def test_idle_holders_are_held_gpus_idle_for_the_time_given() -> None:
    # GIVEN a node whose GPU 0 is leased and idle, GPU 1 leased and busy
    state = fleet(node("n", (gpu(0), gpu(1, util=80)), (), (exclusive(0), exclusive(1))))
    tracker = IdleTracker()
    tracker.observe(state, 100.0)
    # WHEN the screen has watched it for 5 minutes only THEN no idle holder yet (10m asked)
    tracker.observe(state, 400.0)
    assert build_rows(state, tracker.idle_for, 600.0)[0].idle_held == 0
    # WHEN it has watched for 10 minutes THEN GPU 0 is an idle holder, GPU 1 is not
    tracker.observe(state, 700.0)
    assert build_rows(state, tracker.idle_for, 600.0)[0].idle_held == 1
    # AND without a tracker (--once) a held GPU idle now counts
    assert build_rows(state)[0].idle_held == 1


def test_a_row_of_gpus_is_kept_while_the_node_is_the_same_until_a_holder_idles_long() -> None:
    # GIVEN a node read GPU by GPU, GPU 0 leased and idle, the screen watching since 100 s
    state = fleet(node("n", (gpu(0), gpu(1, util=80)), (), (exclusive(0), exclusive(1))))
    tracker, memory = IdleTracker(), fleet_rows.RowMemory()
    tracker.observe(state, 100.0)
    (first,) = build_rows(state, tracker.idle_for, 600.0, memory)
    # WHEN the next reads bring the very same node, 5 minutes on, then 10
    tracker.observe(state, 400.0)
    (kept,) = build_rows(state, tracker.idle_for, 600.0, memory)
    tracker.observe(state, 700.0)
    (idled,) = build_rows(state, tracker.idle_for, 600.0, memory)
    # THEN its row is kept while no holder has idled long enough, then made again with
    # its idle holder, as a row made afresh says
    assert kept is first and first.idle_held == 0
    assert idled.idle_held == 1 and idled == build_rows(state, tracker.idle_for, 600.0)[0]


def test_users_are_counted_across_nodes_from_their_processes() -> None:
    state = fleet(
        node("a", (gpu(0), gpu(1)), (process(0, "alice", 10), process(1, "alice", 5, pid=8))),
        node("b", (gpu(0),), (process(0, "alice", 1), process(0, "bob", 30, pid=9))),
        node("c", (gpu(0),), (), None, exporter=Exporter.DCGM),
    )
    rows, silent, _ = user_rows(state)
    assert [(r.user, r.nodes, r.gpus, r.memory_bytes // GIB) for r in rows] == [
        ("bob", 1, 1, 30),
        ("alice", 2, 3, 16),
    ]
    assert silent == 1, "the dcgm node tells no processes"


def test_users_read_gpu_by_gpu_and_read_as_figures_are_counted_alike() -> None:
    # GIVEN node a read GPU by GPU: alice's process on GPU 0, her job holding GPU 1, and
    # a pod holding GPU 1 (as dcgm-exporter labels it); node b read as its figures,
    # telling alice on 2 GPUs with 60 GiB
    pod = GpuPod(1, "ml", "trainer-0")
    held = idle_gpu_node("a", pods=(pod,), jobs=(GpuJob(1, "4242", "alice"),))
    snapshot = msgspec.structs.replace(held.snapshot, processes=(process(0, "alice", 10),))
    read = msgspec.structs.replace(held, snapshot=snapshot)
    state = fleet(read, summarized("b", (("alice", 2, 60 * GIB),)))
    # WHEN the users view and the rows are made
    users = user_rows(state)
    rows = {row.node: row for row in build_rows(state)}
    # THEN alice counts both nodes, 2 GPUs on each, her memory on both, her job; the pod
    # is a user of its GPU; node a's row names both, its figures told by its GPUs
    assert [(r.user, r.nodes, r.gpus, r.memory_bytes // GIB, r.jobs) for r in users.rows] == [
        ("alice", 2, 4, 70, 1),
        ("(ml/trainer-0)", 1, 1, 0, 0),
    ]
    assert users.silent == 0
    assert rows["a"].users == {"alice", "(ml/trainer-0)"} and rows["a"].jobs == 1


def test_a_node_read_gpu_by_gpu_has_the_figures_its_daemon_exports() -> None:
    # GIVEN a daemon's node read GPU by GPU: a whole GPU with 10 GiB free, and a
    # MIG-enabled one whose largest MIG device has 20 GiB free; a lease on the first, and
    # one its metrics tell on a GPU the node no longer has
    gpus = (gpu(0, used_gib=70), gpu(1, used_gib=10, mig_enabled=True))
    devices = tuple(
        MigDevice(1, index, f"MIG-{index}", memory_free_bytes=size * GIB)
        for index, size in enumerate((20, 20, 10))
    )
    snapshot = Snapshot(FROZEN_TIME, "mig", None, None, gpus, (), devices)
    gone = Lease("GPU-gone", 7, 0, "", "", 0.0, lease_id="l7")
    read = NodeState("mig", True, snapshot, FROZEN_TIME, leases=(exclusive(0), gone))
    # WHEN its row is made
    (row,) = build_rows(fleet(read))
    # THEN its figures are the daemon's own definition: its most free is the MIG
    # device's (a job is never given the split GPU whole), not 70 GiB
    daemons = node_figures(gpus, devices)
    assert row.most_free_bytes == daemons.most_free_bytes == 20 * GIB
    assert (row.gpus, row.memory_free_bytes, row.hottest_c) == (
        daemons.gpus,
        daemons.memory_free_bytes,
        daemons.hottest_c,
    )
    # AND its leases are those on its GPUs, as the daemon counts them
    assert row.leases == leases_on(snapshot, (exclusive(0), gone)) == 1
    # AND the split GPU is not free by pick's rule: the whole one is busy and leased
    assert row.gpus_free == 0


def summarized(name: str, users: tuple[tuple[str, int, int], ...] | None) -> NodeState:
    """A node read through Prometheus as its figures, with its users as told (or not yet)."""
    summary = NodeSummary(2, 0, 0, 0, 50.0, 40, 300.0, leases=0, idle_held=0, users=users)
    return NodeState(name, up=True, snapshot=None, data_at=FROZEN_TIME - 5.0, summary=summary)


def test_a_node_whose_users_are_not_known_yet_is_said_so_never_counted_nor_hidden() -> None:
    # GIVEN alice on node a, as Prometheus told; node b's users not told yet (warming up)
    state = fleet(summarized("a", (("alice", 2, 60 * GIB),)), summarized("b", None))
    # WHEN the users view, the filter user:alice and the totals are made
    users = user_rows(state)
    kept = [r.node for r in build_rows(state) if NodeFilter.parse("user:alice").matches(r)]
    # THEN alice counts node a alone, node b is said not to be counted, the filter keeps it
    # (it may be hers), and the totals line says one node is warming up
    assert [(r.user, r.nodes, r.gpus) for r in users.rows] == [("alice", 1, 2)]
    assert users.unknown == 1
    assert kept == ["a", "b"]
    assert totals(build_rows(state)).warming == 1


# --- sort and filter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ["alpha", "beta", "gone", "stale"]),
        ("user:alice", ["alpha"]),
        ("free", ["alpha", "beta"]),
        ("down", ["gone", "stale"]),
        ("dcgm", ["beta"]),
        ("alp", ["alpha"]),
        ("h100 free", ["alpha", "beta"]),
    ],
    ids=["none", "user", "free", "down", "exporter", "word", "model-and-free"],
)
def test_the_filter_keeps_the_nodes_every_term_matches(text: str, expected: list[str]) -> None:
    view = FleetView().filter(text).sort_by("node")
    view = view if not view.sort_reverse else view.reverse()
    assert [row.node for row in view.arrange(build_rows(MIXED))] == expected


def test_a_term_not_understood_is_said_and_ignored() -> None:
    assert NodeFilter.parse("gpu:3 free").problem == "not understood: gpu:3"


def test_sorting_by_free_puts_the_freest_first_and_ties_go_by_name() -> None:
    rows = build_rows(MIXED)
    assert [r.node for r in FleetView().arrange(rows)] == ["alpha", "beta", "stale", "gone"]
    twins = build_rows(fleet(node("y", (gpu(0),)), node("x", (gpu(0),))))
    assert [r.node for r in FleetView().arrange(twins)] == ["x", "y"]
    assert [r.node for r in FleetView().reverse().arrange(twins)] == ["x", "y"]


def test_cycling_the_sort_visits_every_shown_column_and_comes_back() -> None:
    shown = [c.key for c in columns_for(80)]
    view = FleetView()
    seen = []
    for _ in shown:
        view = view.cycle_sort(shown, 1)
        seen.append(view.sort_column)
    assert sorted(seen) == sorted(shown) and view.sort_column == "free"


def test_a_sort_column_dropped_by_a_narrow_terminal_falls_back_and_comes_back() -> None:
    view = FleetView().sort_by("power").fit_columns(c.key for c in columns_for(80))
    assert view.sort_column == "free"
    assert view.fit_columns(c.key for c in columns_for(200)).sort_column == "power"


# --- widths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [80, 120, 200], ids=["80", "120", "200"])
def test_the_plain_table_fits_the_width(width: int) -> None:
    long_name = node("gpu-node-with-a-very-long-name.cluster.example.org", (gpu(0),))
    state = fleet(*MIXED.nodes, long_name)
    rows = build_rows(state)
    lines = plain_table(FleetView().arrange(rows), totals(rows), width, state.taken_at)
    assert all(len(line) <= width for line in lines)
    assert len(lines) == 2 + len(rows)
    assert any(line.startswith("gpu-node-with") for line in lines), "long names are cut at the end"


def test_at_80_columns_the_table_keeps_what_answers_where_to_run() -> None:
    keys = [c.key for c in columns_for(80)]
    assert {"node", "free", "most_free", "util", "age"} <= set(keys)
    assert [c.key for c in columns_for(200)][-1] == "age" and "power" in keys + [
        c.key for c in columns_for(200)
    ]


# --- 1,000 nodes ----------------------------------------------------------------------------


def test_a_thousand_nodes_cost_one_placement_and_one_filter_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN 1,000 simulated nodes, and counters on the per-node work
    state = SimFleet(1000, clock=lambda: FROZEN_TIME).read()
    calls = {"choose": 0, "matches": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return counted

    monkeypatch.setattr(fleet_rows, "choose", counting("choose", fleet_rows.choose))
    monkeypatch.setattr(NodeFilter, "matches", counting("matches", NodeFilter.matches))
    # WHEN the rows are built, filtered and sorted
    rows = build_rows(state)
    shown = FleetView().filter("free").arrange(rows)
    # THEN each node was placed once and filtered once: the work grows with nodes, not nodes²
    up = sum(n.up for n in state.nodes)
    assert calls == {"choose": up, "matches": 1000}
    assert len(rows) == 1000 and 0 < len(shown) < 1000


# --- the JSON document ----------------------------------------------------------------------


def test_the_document_has_the_issues_shape_and_null_for_the_unknown() -> None:
    document = json.loads(json.dumps(fleet_document(MIXED), allow_nan=False))
    assert set(document) == {"taken_at", "source", "nodes"}
    nodes = {n["node"]: n for n in document["nodes"]}
    assert all(set(n) == NODE_KEYS for n in nodes.values())
    assert all(set(g) == GPU_KEYS for n in nodes.values() for g in n["gpus"])
    alpha = nodes["alpha"]["gpus"]
    assert [(g["leases_exclusive"], g["leases_shared"]) for g in alpha] == [
        (0, 0),
        (1, 0),
        (0, 0),
        (0, 0),
    ]
    assert alpha[3]["utilization_pct"] is None
    assert all(g["leases_exclusive"] is None for g in nodes["beta"]["gpus"])
    assert nodes["gone"] == {
        "node": "gone",
        "label": "gone",
        "target": None,
        "job": None,
        "claims": 1,
        "mig_devices_known": True,
        "up": False,
        "age_s": None,
        "error": "connection refused",
        "exporter": "gpuwatch",
        "simulated": False,
        "lease_waiters": None,
        "longest_wait_s": None,
        "jobs_known": False,
        "gpus": [],
    }
