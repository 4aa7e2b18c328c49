"""The jobs' series of `/metrics`: whether jobs are known, who holds each GPU, idle held GPUs.

    gpuwatch_jobs_known{hostname}                                     1, or 0 while unknown
    gpuwatch_holders_known{hostname}                                  0 where a scheduler is
                                                                      read and does not tell
    gpuwatch_gpu_holders_unknown{gpu,uuid,hostname}                   1 per device a record
                                                                      it doubts names
    gpuwatch_jobs_idle_window_seconds{hostname}                       --idle-window
    gpuwatch_gpu_job_info{gpu,uuid,hostname,job_id,job_user}          1 per GPU a job holds
    gpuwatch_gpu_pod_info{gpu,uuid,hostname,namespace,pod,container}  1 per device a pod holds
    gpuwatch_gpu_allocated_idle_seconds{gpu,uuid,hostname}            per GPU a job holds

Who holds each device is the node's one model of holders (`gpuwatch.holders`), built as
every client builds it; the fleet reads it back from these series
(`gpuwatch.fleet.node_work`), scraped directly or through Prometheus. A node where no
scheduler is read (none there, or `--jobs off`) has `gpuwatch_holders_known` 1 and holds
nothing; one whose scheduler does not tell has 0: no device of it may be given out.

A pod's device is a whole GPU or a MIG device: `uuid` is the device's (`MIG-...` for a MIG
device, whose `gpu` is its `GPU:MIG` label, `0:2`), as dcgm-exporter's pod labels name it.
The pod's labels are `namespace`, `pod` and `container`, as dcgm-exporter's; where a
Prometheus gives the scrape target's own pod labels those names, it renames the series'
(`exported_pod`, ...) unless told `honor_labels`. Every pod sharing a device (time-sliced
replicas) has its own series.

The job is a label of `gpuwatch_gpu_job_info` alone, joined onto other series by
`uuid` and `hostname` where a query wants it: a job id on every GPU series would make
new series at every job, and Prometheus keeps each for its whole retention. The label is
`job_id`, never `job`, which Prometheus gives the scrape job (a target's `job` would be
renamed `exported_job`). Idle seconds are sent only while the snapshot is current, as
every value of a sample is.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwatch.daemon.view import View
from gpuwatch.holders import HolderKind, Holders
from gpuwatch.models import Device, MigDevice, Snapshot

JOB_INFO_LABELS = ("gpu", "uuid", "hostname", "job_id", "job_user")
POD_INFO_LABELS = ("gpu", "uuid", "hostname", "namespace", "pod", "container")
DEVICE_LABELS = ("gpu", "uuid", "hostname")
IDLE_LABELS = DEVICE_LABELS
_NOTHING_SAMPLED = Snapshot(0.0, "", None, None, (), ())


def job_metrics(view: View) -> Iterator[Metric]:
    """The jobs' series of one view."""
    node, jobs, snapshot = view.node, view.jobs, view.snapshot
    known = GaugeMetricFamily(
        "gpuwatch_jobs_known",
        "1 while the scheduler (Slurm, or the kubelet) tells which job or pod holds each GPU; "
        "0 when it is absent, down, slow, or job reading is off (GET /v1/jobs says why).",
        labels=("hostname",),
    )
    known.add_metric([node], 1 if jobs.known else 0)
    yield known
    window = GaugeMetricFamily(
        "gpuwatch_jobs_idle_window_seconds",
        "How long a held GPU may compute nothing before it is waste (--idle-window): the "
        "threshold of the GpuAllocatedIdle alert.",
        labels=("hostname",),
    )
    window.add_metric([node], jobs.idle_window_s)
    yield window
    holders = jobs.holders(snapshot or _NOTHING_SAMPLED)
    yield from _holder_metrics(snapshot or _NOTHING_SAMPLED, holders, node)
    idle = GaugeMetricFamily(
        "gpuwatch_gpu_allocated_idle_seconds",
        "How long the GPU, held by a job, has computed nothing (utilization at most 1%) "
        "without a break; 0 while it computes.",
        labels=IDLE_LABELS,
    )
    for gpu in snapshot.gpus if snapshot is not None else ():
        seconds = jobs.allocated_idle_s.get(gpu.uuid or "")
        if view.current and seconds is not None and holders.holders_of(gpu):
            idle.add_metric([str(gpu.index), gpu.uuid or "", node], seconds)
    yield idle


def _holder_metrics(snapshot: Snapshot, holders: Holders, node: str) -> Iterator[Metric]:
    """Who holds each device, and which nobody can tell about (`gpuwatch.holders`)."""
    known = GaugeMetricFamily(
        "gpuwatch_holders_known",
        "0 while a scheduler is read here and does not tell who holds the GPUs (down, slow, "
        "or an answer that cannot be believed): no GPU may then be given out; else 1.",
        labels=("hostname",),
    )
    known.add_metric([node], 1 if holders.known else 0)
    yield known
    unknown = GaugeMetricFamily(
        "gpuwatch_gpu_holders_unknown",
        "Always 1, for each GPU or MIG device whose holders nobody can tell because a record "
        "of the scheduler's answer naming it could not be believed (GET /v1/jobs says why).",
        labels=DEVICE_LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_gpu_job_info",
        "Always 1, for each GPU a job holds; the labels name the job (scheduler's id, user).",
        labels=JOB_INFO_LABELS,
    )
    pods = GaugeMetricFamily(
        "gpuwatch_gpu_pod_info",
        "Always 1, for each GPU or MIG device a Kubernetes pod holds; the labels name the pod "
        "(its namespace, name and container).",
        labels=POD_INFO_LABELS,
    )
    for device, parent in _devices(snapshot):
        labels = [_label(device), device.uuid or "", node]
        inherited = device is not parent and holders.unknown_of(parent)
        if holders.known and holders.unknown_of(device) and not inherited:
            unknown.add_metric(labels, 1)
        for holder in holders.holders_of(device):
            if device is not parent and holder in holders.holders_of(parent):
                continue  # its GPU's holder: said once, on the GPU
            if holder.kind is HolderKind.POD:
                namespace, _, pod = holder.name.partition("/")
                pods.add_metric([*labels, namespace, pod, holder.container or ""], 1)
            elif device is parent:
                info.add_metric([*labels, holder.name, holder.user or ""], 1)
    yield unknown
    yield info
    yield pods


def _devices(snapshot: Snapshot) -> Iterator[tuple[Device, Device]]:
    """Each GPU and MIG device with its GPU (a GPU is its own)."""
    gpus = {gpu.index: gpu for gpu in snapshot.gpus}
    yield from ((gpu, gpu) for gpu in snapshot.gpus)
    for mig in snapshot.mig_devices:
        if (parent := gpus.get(mig.gpu_index)) is not None:
            yield mig, parent


def _label(device: Device) -> str:
    """The `gpu` label: the GPU's index, or a MIG device's `GPU:MIG`."""
    return device.label if isinstance(device, MigDevice) else str(device.index)
