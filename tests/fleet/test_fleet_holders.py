"""The fleet table, node view and users view of nodes whose GPUs pods hold, and of two
targets that claim one name (issue 27)."""

from __future__ import annotations

from gpuwatch.fleet_model import FleetState, GpuPod
from gpuwatch.tui.fleet.cells import plain_table
from gpuwatch.tui.fleet.node_cards import FleetSection
from gpuwatch.tui.fleet.rows import RowMemory, build_rows, totals, user_rows
from tests.helpers.fleet.nodes import idle_gpu_node

POD = GpuPod(0, "ml", "train-0", "main")


def test_a_gpu_a_pod_holds_is_never_free_and_the_pod_is_a_user_of_the_node() -> None:
    # GIVEN a node of two idle GPUs, the first held by a Kubernetes pod
    fleet = FleetState(0.0, "t", (idle_gpu_node("k8s-1", pods=(POD,)),))
    # WHEN its row is made, afresh and from the rows' memory
    for memory in (None, RowMemory()):
        (row,) = build_rows(fleet, memory=memory)
        # THEN one GPU is free of two, and the pod is among its users as (namespace/pod)
        assert (row.gpus_free, row.gpus) == (1, 2)
        assert row.users == frozenset({"(ml/train-0)"})


def test_the_users_view_shows_a_pod_by_namespace_and_name() -> None:
    # GIVEN a node whose GPU 0 a pod holds
    fleet = FleetState(0.0, "t", (idle_gpu_node("k8s-1", pods=(POD,)),))
    # WHEN the users view is made THEN the pod holds one GPU on one node
    users, silent, _ = user_rows(fleet)
    assert [(u.user, u.nodes, u.gpus) for u in users] == [("(ml/train-0)", 1, 1)]
    assert silent == 0


def test_the_node_view_names_the_pod_on_its_gpus_card() -> None:
    # GIVEN the node view of a node whose GPU 0 a pod holds
    section = FleetSection("k8s-1", 2.0, waits_for_history=False)
    section.apply_node(idle_gpu_node("k8s-1", pods=(POD,)), 1.0)
    # WHEN each GPU's card is made THEN GPU 0's names the pod, GPU 1's names none
    notes = [section.card_input(index, 1.0, 60, 600.0).idle_note for index in (0, 1)]
    assert "pod (ml/train-0)" in notes[0]
    assert "pod" not in notes[1]


def test_two_targets_claiming_one_name_are_two_rows_both_marked() -> None:
    # GIVEN two targets that both name themselves gpu-07
    twins = [idle_gpu_node("gpu-07", f"10.0.0.{n}:9400", claims=2) for n in (7, 66)]
    fleet = FleetState(0.0, "t", tuple(twins))
    # WHEN the rows and the plain table are made
    rows = build_rows(fleet, memory=RowMemory())
    text = "\n".join(plain_table(rows, totals(rows), 200, fleet.taken_at))
    # THEN they are two rows apart, each marked as one of two claiming the name (the
    # table may cut the mark at its name column's width, never the label)
    assert [row.key for row in rows] == ["gpu-07@10.0.0.7:9400", "gpu-07@10.0.0.66:9400"]
    for row in rows:
        assert row.shown_name == f"{row.key} (2 targets claim gpu-07)"
        assert f"{row.key} (2 targets claim" in text
