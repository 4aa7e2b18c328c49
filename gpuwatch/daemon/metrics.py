"""Prometheus metrics of the latest snapshot, in base units, for `/metrics`.

Every series carries the label `hostname`: the node's name (`--node-name`, else
the host name), so that a fleet's series name their node, even from a container.
Every GPU series carries the labels `gpu` (NVML index), `uuid`, `pci_bus_id`,
`model_name` and `hostname`, so that dashboards can join, group and name GPUs
across a fleet; one the driver could not tell (a GPU lost before its first
sample) is empty, which Prometheus reads as absent. A value a GPU does not
report is left out, not sent as 0. While the snapshot is not current (sampling
fails or stalls), no value of it is sent: every GPU is down, and
`gpuwatch_sample_timestamp_seconds` says how old the last snapshot is.

The node's own figures (`gpuwatch_node_*`) come from `node_series`.

Jobs (`gpuwatch_jobs_known`, `gpuwatch_gpu_job_info`, `gpuwatch_gpu_pod_info`,
`gpuwatch_gpu_allocated_idle_seconds`) come from `job_series`; no other series carries a
job. A GPU a job or pod holds is never available (`gpuwatch_memory_available_bytes`), nor
one whose holders nobody can tell (`gpuwatch_holders_known`).

MIG device series (`gpuwatch_mig_*`) carry the parent's `gpu` index, the MIG
device's own `uuid`, its `profile`, `gpu_instance_id` and `compute_instance_id`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpuwatch._version import __version__
from gpuwatch.daemon.job_series import job_metrics
from gpuwatch.daemon.node_series import node_metrics
from gpuwatch.daemon.training_series import training_indices, training_metrics
from gpuwatch.daemon.view import View
from gpuwatch.holders import Holders
from gpuwatch.models import GpuSample, Lease, MigDevice, Snapshot
from gpuwatch.placement.gpus import GPUS
from gpuwatch.placement.rules import qualifying

GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "model_name", "hostname")
# (metric name, help, value in base units or None)
_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("memory_total_bytes", "Total GPU memory.", lambda g: g.memory_total_bytes),
    ("memory_used_bytes", "GPU memory in use.", lambda g: g.memory_used_bytes),
    (
        "memory_free_bytes",
        "GPU memory free for new allocations, as CUDA sees it.",
        lambda g: g.memory_free_bytes,
    ),
    (
        "memory_reserved_bytes",
        "GPU memory reserved by the driver.",
        lambda g: g.memory_reserved_bytes,
    ),
    (
        "utilization_ratio",
        "Fraction of time a kernel ran on the GPU over the last sample period.",
        lambda g: _ratio(g.utilization_pct),
    ),
    (
        "memory_utilization_ratio",
        "Fraction of time GPU memory was read or written.",
        lambda g: _ratio(g.memory_utilization_pct),
    ),
    ("temperature_celsius", "GPU core temperature.", lambda g: g.temperature_c),
    ("power_watts", "Power draw.", lambda g: g.power_w),
    ("power_limit_watts", "Enforced power limit.", lambda g: g.power_limit_w),
    ("fan_ratio", "Fan speed as a fraction of its maximum.", lambda g: _ratio(g.fan_pct)),
    (
        "sm_clock_hertz",
        "SM clock.",
        lambda g: None if g.sm_clock_mhz is None else g.sm_clock_mhz * 1e6,
    ),
    (
        "performance_state",
        "Performance state: 0 is the fastest, 15 the slowest.",
        lambda g: g.performance_state,
    ),
)


class ViewCollector(Collector):
    """The metrics of one view: what one scrape shows."""

    def __init__(self, view: View) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        yield from self._snapshot_metrics()
        view = self._view
        yield from training_metrics(view.training, training_indices(view.snapshot), view.node)
        yield from job_metrics(view)

    def _node_gauge(self, name: str, text: str, value: float) -> Metric:
        """A gauge of the whole node: `hostname` is its one label."""
        return _gauge(name, text, [("hostname", self._view.node)], value)

    def _snapshot_metrics(self) -> Iterator[Metric]:
        view, snapshot, node = self._view, self._view.snapshot, self._view.node
        yield _gauge(
            "build_info", "gpuwatch's version.", [("version", __version__), ("hostname", node)], 1
        )
        yield self._node_gauge(
            "simulated",
            "1 when the node is simulated (gpuwatch daemon --sim): its GPUs are made up; "
            "0 for real GPUs.",
            1 if view.simulated else 0,
        )
        yield self._node_gauge(
            "sampling_up",
            "1 while sampling the GPUs succeeds and the snapshot is current; 0 before the "
            "first snapshot.",
            1 if view.current else 0,
        )
        if snapshot is None:
            return
        yield self._node_gauge(
            "sample_timestamp_seconds",
            "When the snapshot was taken (Unix time).",
            snapshot.taken_at,
        )
        if not view.current:
            yield from _gpus_down(snapshot, node)
            return
        by_uuid = {gpu.uuid: gpu for gpu in snapshot.gpus}
        yield from _gpu_metrics(snapshot, node)
        yield from _process_metrics(snapshot, node)
        yield from _lease_metrics(snapshot, node, view.leases, by_uuid)
        yield from _available_metrics(snapshot, node, view.leases, view.jobs.holders(snapshot))
        yield from node_metrics(snapshot, node, view.leases)
        yield self._node_gauge(
            "lease_waiters",
            "Jobs waiting in line for GPUs on this node (gpuwatch pick --wait).",
            len(view.waiters),
        )
        yield self._node_gauge(
            "lease_longest_wait_seconds",
            "How long the oldest waiting job has been in line; 0 with none waiting.",
            max((waiter.waited_s for waiter in view.waiters), default=0.0),
        )
        yield from _mig_metrics(snapshot, node, view.leases)


class _Labelled(Collector):
    """Another collector's series, each with the node's `hostname` label added."""

    def __init__(self, collector: Collector, node: str) -> None:
        self._collector = collector
        self._node = node

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            family.samples = [
                sample._replace(labels={**sample.labels, "hostname": self._node})
                for sample in family.samples
            ]
            yield family


def registry_for(view: View) -> CollectorRegistry:
    """A registry with the metrics of `view` (GPUs, leases, training: `gpuwatch_torch_*`)
    and the daemon's own (`gpuwatch_daemon_process_*`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(view))
    process = ProcessCollector(namespace="gpuwatch_daemon", registry=None)
    registry.register(_Labelled(process, view.node))
    return registry


def exposition(view: View) -> bytes:
    """The text of `/metrics` for `view`."""
    return generate_latest(registry_for(view))


def _gpu_metrics(snapshot: Snapshot, node: str) -> Iterator[Metric]:
    families = {
        name: GaugeMetricFamily(f"gpuwatch_{name}", text, labels=GPU_LABELS)
        for name, text, _ in _GPU_GAUGES
    }
    for gpu in snapshot.gpus:
        labels = _gpu_labels(gpu, node)
        for name, _, value_of in _GPU_GAUGES:
            if (value := value_of(gpu)) is not None:
                families[name].add_metric(labels, value)
    yield from families.values()
    yield from _identity_metrics(snapshot, node, up=lambda gpu: gpu.ok)


def _gpus_down(snapshot: Snapshot, node: str) -> Iterator[Metric]:
    """Who the GPUs are, all down: nothing of a snapshot that is not current passes for a
    reading."""
    yield from _identity_metrics(snapshot, node, up=lambda gpu: False)


def _identity_metrics(
    snapshot: Snapshot, node: str, up: Callable[[GpuSample], bool]
) -> Iterator[Metric]:
    up_family = GaugeMetricFamily(
        "gpuwatch_gpu_up",
        "1 when the GPU could be read, 0 after a fault or while sampling fails "
        "(see gpuwatch status).",
        labels=GPU_LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_gpu_info",
        "Always 1; the labels describe the GPU.",
        labels=(*GPU_LABELS, "driver_version", "cuda_driver_version"),
    )
    for gpu in snapshot.gpus:
        labels = _gpu_labels(gpu, node)
        up_family.add_metric(labels, 1 if up(gpu) else 0)
        info.add_metric(
            [*labels, snapshot.driver_version or "", snapshot.cuda_driver_version or ""], 1
        )
    yield up_family
    yield info


def _available_metrics(
    snapshot: Snapshot, node: str, leases: tuple[Lease, ...], holders: Holders
) -> Iterator[Metric]:
    """Pick's verdict on each whole GPU, for a job of another user wanting an idle one:
    `gpuwatch where` reads it instead of every process, lease and limit of the fleet. A
    GPU a job or pod holds is not available, nor one whose holders are unknown."""
    memory = GaugeMetricFamily(
        "gpuwatch_memory_available_bytes",
        "The GPU's free memory where pick's rules would give the whole GPU to a new job of "
        "another user now (readable, no lease, held by no job or pod and its holders known, "
        "not MIG, idle at the default limits), else 0.",
        labels=GPU_LABELS,
    )
    given = {gpu.index for gpu in qualifying(GPUS, snapshot, leases, holders)}
    for gpu in snapshot.gpus:
        free = gpu.memory_free_bytes if gpu.index in given else None
        memory.add_metric(_gpu_labels(gpu, node), free or 0)
    yield memory
    yield _gauge(
        "gpus_available",
        "How many whole GPUs pick's rules would give to a new job of another user now.",
        [("hostname", node)],
        len(given),
    )


def _process_metrics(snapshot: Snapshot, node: str) -> Iterator[Metric]:
    memory = GaugeMetricFamily(
        "gpuwatch_process_memory_bytes",
        "GPU memory used by a process.",
        labels=("gpu", "uuid", "hostname", "pid", "user", "process", "kind"),
    )
    count = GaugeMetricFamily("gpuwatch_processes", "Processes using the GPU.", labels=GPU_LABELS)
    gpus = {gpu.index: gpu for gpu in snapshot.gpus}
    for process in snapshot.processes:
        if process.memory_used_bytes is not None:
            name = os.path.basename((process.command or "").split(" ", 1)[0]) or "unknown"
            memory.add_metric(
                [
                    str(process.gpu_index),
                    process.gpu_uuid or "",
                    node,
                    str(process.pid),
                    process.user or "",
                    name,
                    str(process.kind),
                ],
                process.memory_used_bytes,
            )
    for index, gpu in gpus.items():
        count.add_metric(_gpu_labels(gpu, node), len(snapshot.processes_on(index)))
    yield memory
    yield count


def _lease_metrics(
    snapshot: Snapshot,
    node: str,
    leases: tuple[Lease, ...],
    by_uuid: dict[str | None, GpuSample],
) -> Iterator[Metric]:
    held = GaugeMetricFamily(
        "gpuwatch_leases",
        "Leases held on the GPU (gpuwatch pick/select).",
        labels=(*GPU_LABELS, "mode"),
    )
    declared = GaugeMetricFamily(
        "gpuwatch_lease_declared_memory_bytes",
        "Memory declared by shared leases on the GPU (--mem).",
        labels=GPU_LABELS,
    )
    for gpu in snapshot.gpus:
        on_gpu = [lease for lease in leases if by_uuid.get(lease.gpu_uuid) is gpu]
        labels = _gpu_labels(gpu, node)
        exclusive = sum(lease.exclusive for lease in on_gpu)
        held.add_metric([*labels, "exclusive"], exclusive)
        held.add_metric([*labels, "shared"], len(on_gpu) - exclusive)
        declared.add_metric(labels, sum(lease.mem_bytes or 0 for lease in on_gpu))
    yield held
    yield declared


MIG_LABELS = ("gpu", "uuid", "profile", "gpu_instance_id", "compute_instance_id", "hostname")
_MIG_GAUGES: tuple[tuple[str, str, Callable[[MigDevice], int | None]], ...] = (
    ("memory_total_bytes", "Memory of the MIG device.", lambda m: m.memory_total_bytes),
    ("memory_used_bytes", "Memory in use on the MIG device.", lambda m: m.memory_used_bytes),
    ("memory_free_bytes", "Memory free on the MIG device.", lambda m: m.memory_free_bytes),
)


def _mig_metrics(snapshot: Snapshot, node: str, leases: tuple[Lease, ...]) -> Iterator[Metric]:
    enabled = GaugeMetricFamily(
        "gpuwatch_mig_enabled",
        "1 when the GPU is in MIG mode (handed out as MIG devices only), 0 when not.",
        labels=GPU_LABELS,
    )
    for gpu in snapshot.gpus:
        if gpu.mig_enabled is not None:
            enabled.add_metric(_gpu_labels(gpu, node), int(gpu.mig_enabled))
    yield enabled
    families = {
        name: GaugeMetricFamily(f"gpuwatch_mig_{name}", text, labels=MIG_LABELS)
        for name, text, _ in _MIG_GAUGES
    }
    processes = GaugeMetricFamily(
        "gpuwatch_mig_processes", "Processes in the MIG device.", labels=MIG_LABELS
    )
    held = GaugeMetricFamily(
        "gpuwatch_mig_leases", "Leases held on the MIG device.", labels=(*MIG_LABELS, "mode")
    )
    for device in snapshot.mig_devices:
        labels = _mig_labels(device, node)
        for name, _, value_of in _MIG_GAUGES:
            if (value := value_of(device)) is not None:
                families[name].add_metric(labels, value)
        processes.add_metric(labels, len(snapshot.processes_in(device)))
        on_it = [lease for lease in leases if device.uuid and lease.gpu_uuid == device.uuid]
        exclusive = sum(lease.exclusive for lease in on_it)
        held.add_metric([*labels, "exclusive"], exclusive)
        held.add_metric([*labels, "shared"], len(on_it) - exclusive)
    yield from families.values()
    yield processes
    yield held


def _mig_labels(device: MigDevice, hostname: str) -> list[str]:
    ids = (device.gpu_instance_id, device.compute_instance_id)
    return [
        str(device.gpu_index),
        device.uuid or "",
        device.profile or "",
        *("" if value is None else str(value) for value in ids),
        hostname,
    ]


def _gpu_labels(gpu: GpuSample, hostname: str) -> list[str]:
    return [str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "", gpu.name or "", hostname]


def _gauge(name: str, text: str, labels: list[tuple[str, str]], value: float) -> Metric:
    family = GaugeMetricFamily(f"gpuwatch_{name}", text, labels=[key for key, _ in labels])
    family.add_metric([label for _, label in labels], value)
    return family


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100
