"""`gpuwatch fleet --json`: a fleet as one JSON document, in the model's field names.

    {"taken_at", "source", "nodes": [{"node", "up", "age_s", "error", "exporter",
     "simulated", "lease_waiters", "longest_wait_s", "jobs_known",
     "gpus": [{"index", "uuid", "name", "memory_total_bytes", "memory_free_bytes",
               "memory_used_bytes", "utilization_pct", "temperature_c", "power_w",
               "leases_exclusive", "leases_shared", "mig_enabled",
               "job_id", "job_user", "allocated_idle_s"}]}]}

What a source does not know is `null`: a node never read has no GPUs; `leases_*` are
`null` on a node whose exporter tells no leases (not 0, which says "none"), and so are
`lease_waiters` and `longest_wait_s` where the exporter tells no line. `jobs_known` says
whether a GPU's `job_id: null` means "no job" (true) or "unknown" (false). `simulated` is
true for a node whose daemon serves a simulated node (its GPUs are made up).
"""

from __future__ import annotations

import math
from typing import Any

from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.models import GpuSample, Lease

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory_total_bytes",
    "memory_free_bytes",
    "memory_used_bytes",
    "utilization_pct",
    "temperature_c",
    "power_w",
)


def fleet_document(fleet: FleetState) -> dict[str, Any]:
    """The whole fleet, nodes in the fleet's order (by name)."""
    return {
        "taken_at": fleet.taken_at,
        "source": fleet.source,
        "nodes": [_node(node) for node in fleet.nodes],
    }


def _node(node: NodeState) -> dict[str, Any]:
    gpus = node.snapshot.gpus if node.snapshot is not None else ()
    return {
        "node": node.name,
        "up": node.up,
        "age_s": _finite(node.age_s),
        "error": node.error,
        "exporter": None if node.exporter is None else str(node.exporter),
        "simulated": node.simulated,
        "lease_waiters": node.lease_waiters,
        "longest_wait_s": _finite(node.longest_wait_s),
        "jobs_known": node.jobs is not None,
        "gpus": [_gpu(gpu, node) for gpu in gpus],
    }


def _gpu(gpu: GpuSample, node: NodeState) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(gpu, name) for name in GPU_FIELDS}
    out["power_w"] = _finite(gpu.power_w)
    if node.leases is None:
        out["leases_exclusive"] = out["leases_shared"] = None
    else:
        mine = [lease for lease in node.leases if _on(lease, gpu)]
        out["leases_exclusive"] = sum(lease.exclusive for lease in mine)
        out["leases_shared"] = len(mine) - out["leases_exclusive"]
    out["mig_enabled"] = gpu.mig_enabled
    jobs = node.jobs_on(gpu.index)
    out["job_id"] = jobs[0].job_id if jobs else None
    out["job_user"] = jobs[0].user if jobs else None
    out["allocated_idle_s"] = _finite(jobs[0].allocated_idle_s) if jobs else None
    return out


def _on(lease: Lease, gpu: GpuSample) -> bool:
    """A lease on this GPU, or on one of its MIG devices (whose index is the GPU's)."""
    if lease.gpu_uuid.startswith("MIG-"):
        return lease.gpu_index == gpu.index
    return gpu.uuid is not None and lease.gpu_uuid == gpu.uuid


def _finite(value: float | None) -> float | None:
    """`NaN` and infinities are not JSON: unknown."""
    return value if value is None or math.isfinite(value) else None
