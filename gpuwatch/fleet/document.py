"""`gpuwatch fleet --json`: a fleet as one JSON document, in the model's field names.

    {"taken_at", "source", "nodes": [{"node", "label", "target", "job", "claims", "up",
     "age_s", "error", "exporter", "simulated", "lease_waiters", "longest_wait_s",
     "jobs_known", "mig_devices_known",
     "gpus": [{"index", "uuid", "name", "pci_bus_id", "memory_total_bytes",
               "memory_free_bytes", "memory_used_bytes", "utilization_pct",
               "temperature_c", "power_w", "leases_exclusive", "leases_shared",
               "mig_enabled", "job_id", "job_user", "allocated_idle_s", "pods",
               "processes": [{"pid", "user", "command", "memory_used_bytes", "kind",
                              "mig_uuid"}],
               "mig_devices": [{"index", "uuid", "profile", "gpu_instance_id",
                                "compute_instance_id", "memory_total_bytes",
                                "memory_used_bytes", "memory_free_bytes", "pods"}]}]}]}

A node is a scrape target (`target`, and `job` through Prometheus); `node` is the name it
gives, `claims` how many targets give that name, `label` what tells it apart (`node`, or
`node@target`). `pods` are the Kubernetes pods holding a GPU or MIG device, each
`{"namespace", "pod", "container"}`. What a source does not know is `null`: a node never
read has no GPUs; `leases_*` are `null` on a node whose exporter tells no leases (not 0,
which says "none"), and so are `lease_waiters` and `longest_wait_s` where the exporter
tells no line. `jobs_known` says whether a GPU's `job_id: null` means "no job" (true) or
"unknown" (false); `mig_devices_known: false` says a MIG-enabled GPU's devices are not
all listed (its exporter does not tell them). `simulated` is true for a node whose daemon
serves a simulated node (its GPUs are made up).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpuwatch.fleet_model import FleetState, GpuPod, NodeState
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessUsage, Snapshot

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_bytes",
    "memory_free_bytes",
    "memory_used_bytes",
    "utilization_pct",
    "temperature_c",
    "power_w",
)
MIG_FIELDS = (
    "index",
    "uuid",
    "profile",
    "gpu_instance_id",
    "compute_instance_id",
    "memory_total_bytes",
    "memory_used_bytes",
    "memory_free_bytes",
)
PROCESS_FIELDS = ("pid", "user", "command", "memory_used_bytes", "mig_uuid")


def fleet_document(fleet: FleetState) -> dict[str, Any]:
    """The whole fleet, nodes in the fleet's order (by name, then target)."""
    return {
        "taken_at": fleet.taken_at,
        "source": fleet.source,
        "nodes": [_node(node, fleet.taken_at) for node in fleet.nodes],
    }


def document_text(fleet: FleetState) -> list[str]:
    """`fleet_document` as JSON text, newline-ended, in pieces of one node each (write
    them one after the other): the text of `json.dumps`, built without the whole document
    as objects beside it, a node's objects at a time (10,000 nodes: about 40 MiB of text)."""
    encode = json.JSONEncoder(allow_nan=False).encode
    head = encode({"taken_at": fleet.taken_at, "source": fleet.source, "nodes": []})
    pieces = [head.removesuffix("]}")]
    taken_at = fleet.taken_at
    pieces += [
        ("" if i == 0 else ", ") + encode(_node(n, taken_at)) for i, n in enumerate(fleet.nodes)
    ]
    pieces.append("]}\n")
    return pieces


def _node(node: NodeState, taken_at: float) -> dict[str, Any]:
    snapshot = node.snapshot
    gpus = snapshot.gpus if snapshot is not None else ()
    return {
        "node": node.name,
        "label": node.label,
        "target": node.target or None,
        "job": node.job,
        "claims": node.claims,
        "up": node.up,
        "age_s": _finite(node.age_at(taken_at)),
        "error": node.error,
        "exporter": None if node.exporter is None else str(node.exporter),
        "simulated": node.simulated,
        "lease_waiters": node.lease_waiters,
        "longest_wait_s": _finite(node.longest_wait_s),
        "jobs_known": node.jobs is not None,
        "mig_devices_known": node.mig_devices_known,
        "gpus": [_gpu(gpu, node, snapshot) for gpu in gpus if snapshot is not None],
    }


def _gpu(gpu: GpuSample, node: NodeState, snapshot: Snapshot) -> dict[str, Any]:
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
    pods = node.pods_on(gpu.index)
    out["pods"] = [_pod(pod) for pod in pods if pod.gpu_instance_id is None]
    out["processes"] = [_process(p) for p in snapshot.processes_on(gpu.index)]
    out["mig_devices"] = [_mig(m, pods) for m in snapshot.mig_devices_of(gpu.index)]
    return out


def _mig(device: MigDevice, pods: tuple[GpuPod, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(device, name) for name in MIG_FIELDS}
    instance = device.gpu_instance_id
    out["pods"] = [_pod(p) for p in pods if instance is not None and p.gpu_instance_id == instance]
    return out


def _process(process: ProcessUsage) -> dict[str, Any]:
    out: dict[str, Any] = {name: getattr(process, name) for name in PROCESS_FIELDS}
    out["kind"] = str(process.kind)
    return out


def _pod(pod: GpuPod) -> dict[str, str | None]:
    return {"namespace": pod.namespace, "pod": pod.pod, "container": pod.container}


def _on(lease: Lease, gpu: GpuSample) -> bool:
    """A lease on this GPU, or on one of its MIG devices (whose index is the GPU's)."""
    if lease.gpu_uuid.startswith("MIG-"):
        return lease.gpu_index == gpu.index
    return gpu.uuid is not None and lease.gpu_uuid == gpu.uuid


def _finite(value: float | None) -> float | None:
    """`NaN` and infinities are not JSON: unknown."""
    return value if value is None or math.isfinite(value) else None
