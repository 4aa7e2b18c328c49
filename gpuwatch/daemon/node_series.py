"""The node's own figures in `/metrics`: what the fleet table shows of it, one series each.

    gpuwatch_node_gpus{hostname}                       its GPUs, readable or not
    gpuwatch_node_memory_free_bytes{hostname}          free memory of its readable GPUs
    gpuwatch_node_memory_free_max_bytes{hostname}      the most free on one of them
    gpuwatch_node_utilization_ratio{hostname}          their mean utilization
    gpuwatch_node_temperature_max_celsius{hostname}    the hottest
    gpuwatch_node_power_watts{hostname}                their power draw together
    gpuwatch_node_leases{hostname}                     leases on its GPUs and MIG devices

Computed by the fleet's own code (`gpuwatch.node_figures`, `NodeState.figures`), as
`gpuwatch_gpus_available` is by pick's: a fleet table reads these instead of every GPU's
series, and Prometheus aggregates nothing. Sent only while the snapshot is current, as
every value of a sample is; a figure no readable GPU tells is left out.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwatch import node_figures as f
from gpuwatch.models import Lease, Snapshot


def node_metrics(snapshot: Snapshot, node: str, leases: tuple[Lease, ...]) -> Iterator[Metric]:
    figures = f.node_figures(snapshot.gpus, snapshot.mig_devices)
    ratio = None if figures.utilization_pct is None else figures.utilization_pct / 100
    for name, text, value in (
        (f.GPUS, "GPUs on the node, readable or not.", figures.gpus),
        (
            f.MEMORY_FREE,
            "Free memory of the node's readable GPUs together.",
            figures.memory_free_bytes,
        ),
        (
            f.MEMORY_FREE_MAX,
            "The most free memory on one readable GPU of the node, or MIG device of a split one.",
            figures.most_free_bytes,
        ),
        (
            f.UTILIZATION,
            "Mean utilization of the node's readable GPUs.",
            ratio,
        ),
        (
            f.TEMPERATURE_MAX,
            "Temperature of the node's hottest readable GPU.",
            figures.hottest_c,
        ),
        (
            f.POWER,
            "Power draw of the node's readable GPUs together.",
            figures.power_w,
        ),
        (
            f.LEASES,
            "Leases held on the node's GPUs and MIG devices.",
            f.leases_on(snapshot, leases),
        ),
    ):
        if value is not None:
            family = GaugeMetricFamily(name, text, labels=("hostname",))
            family.add_metric([node], value)
            yield family
