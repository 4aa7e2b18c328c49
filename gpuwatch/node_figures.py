"""A node's figures from its GPUs: what the fleet table shows of it.

One definition for both who compute them: the fleet's model, for a node read GPU by GPU
(`NodeState.figures`), and the daemon, which exports them (`gpuwatch_node_*`, one series
each per node) so that a fleet table read through Prometheus costs bytes per node, not per
GPU, and the server no aggregation. A GPU the node cannot read counts among its GPUs and
in no other figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gpuwatch.models import GpuSample, Lease, MigDevice, Snapshot

GPUS = "gpuwatch_node_gpus"
MEMORY_FREE = "gpuwatch_node_memory_free_bytes"
MEMORY_FREE_MAX = "gpuwatch_node_memory_free_max_bytes"
UTILIZATION = "gpuwatch_node_utilization_ratio"
TEMPERATURE_MAX = "gpuwatch_node_temperature_max_celsius"
POWER = "gpuwatch_node_power_watts"
LEASES = "gpuwatch_node_leases"
"""The daemon's series of these figures, one each per node (`gpuwatch.daemon.node_series`)."""


class NodeFigures(msgspec.Struct, frozen=True):
    """`None`: no readable GPU tells it."""

    gpus: int
    most_free_bytes: int | None
    """The most free memory on one device a job could be given: a GPU, or one MIG
    device of a MIG-enabled GPU (never that GPU's whole free memory)."""
    memory_free_bytes: int | None
    utilization_pct: float | None
    hottest_c: int | None
    power_w: float | None


def node_figures(gpus: Sequence[GpuSample], mig_devices: Sequence[MigDevice] = ()) -> NodeFigures:
    """The figures of a node's `gpus` and the MIG devices of those that are split."""
    readable = [gpu for gpu in gpus if gpu.error is None]
    free = [gpu.memory_free_bytes for gpu in readable if gpu.memory_free_bytes is not None]
    split = {gpu.index for gpu in readable if gpu.mig_enabled}
    whole = [
        gpu.memory_free_bytes
        for gpu in readable
        if gpu.memory_free_bytes is not None and gpu.index not in split
    ]
    slices = [
        device.memory_free_bytes
        for device in mig_devices
        if device.gpu_index in split and device.memory_free_bytes is not None
    ]
    busy = [gpu.utilization_pct for gpu in readable if gpu.utilization_pct is not None]
    hot = [gpu.temperature_c for gpu in readable if gpu.temperature_c is not None]
    power = [gpu.power_w for gpu in readable if gpu.power_w is not None]
    return NodeFigures(
        gpus=len(gpus),
        most_free_bytes=max([*whole, *slices], default=None),
        memory_free_bytes=sum(free) if free else None,
        utilization_pct=sum(busy) / len(busy) if busy else None,
        hottest_c=max(hot, default=None),
        power_w=sum(power) if power else None,
    )


def leases_on(snapshot: Snapshot, leases: Sequence[Lease]) -> int:
    """The leases held on the node's GPUs and MIG devices (as its series count them)."""
    uuids = {gpu.uuid for gpu in snapshot.gpus} | {m.uuid for m in snapshot.mig_devices}
    uuids.discard(None)
    return sum(lease.gpu_uuid in uuids for lease in leases)
