"""Fleet nodes made in a test: a node read GPU by GPU, its GPUs idle and empty."""

from __future__ import annotations

from typing import Any

from gpuwatch.fleet.series_dcgm import pod_claims
from gpuwatch.fleet_model import Exporter, NodeState
from gpuwatch.holders import holders_on
from gpuwatch.models import GpuSample, Snapshot

GIB = 1 << 30
TOTAL = 80 * GIB


def idle_gpu_node(name: str, target: str = "", **fields: Any) -> NodeState:
    """`name`'s node at `target` (dcgm-exporter's), two idle 80 GiB GPUs with nothing on
    them; `fields`: the rest of its `NodeState` (pods, claims, jobs)."""
    gpus = tuple(
        GpuSample(i, f"GPU-{name}-{target}-{i}", "H100", None, TOTAL, 0, TOTAL, utilization_pct=0)
        for i in range(2)
    )
    snapshot = Snapshot(1000.0, name, None, None, gpus, ())
    if pods := fields.pop("pods", ()):  # held as dcgm-exporter's labels would say
        fields["holders"] = holders_on(snapshot, pod_claims(pods, gpus, ()).held)
    return NodeState(name, True, snapshot, 1.0, exporter=Exporter.DCGM, target=target, **fields)
