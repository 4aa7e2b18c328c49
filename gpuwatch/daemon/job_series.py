"""The jobs' series of `/metrics`: whether jobs are known, who holds each GPU, idle held GPUs.

    gpuwatch_jobs_known{hostname}                                     1, or 0 while unknown
    gpuwatch_jobs_idle_window_seconds{hostname}                       --idle-window
    gpuwatch_gpu_job_info{gpu,uuid,hostname,job_id,job_user}          1 per GPU a job holds
    gpuwatch_gpu_pod_info{gpu,uuid,hostname,namespace,pod,container}  1 per device a pod holds
    gpuwatch_gpu_allocated_idle_seconds{gpu,uuid,hostname}            per GPU a job holds

A pod's device is a whole GPU or a MIG device: `uuid` is the device's (`MIG-...` for a MIG
device, whose `gpu` is its `GPU:MIG` label, `0:2`), as dcgm-exporter's pod labels name it.
The pod's labels are `namespace`, `pod` and `container`, as dcgm-exporter's; where a
Prometheus gives the scrape target's own pod labels those names, it renames the series'
(`exported_pod`, ...) unless told `honor_labels`.

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
from gpuwatch.jobs.job_table import JobTable, Pod
from gpuwatch.models import Device, MigDevice, Snapshot

JOB_INFO_LABELS = ("gpu", "uuid", "hostname", "job_id", "job_user")
POD_INFO_LABELS = ("gpu", "uuid", "hostname", "namespace", "pod", "container")
IDLE_LABELS = ("gpu", "uuid", "hostname")


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
    info = GaugeMetricFamily(
        "gpuwatch_gpu_job_info",
        "Always 1, for each GPU a job holds; the labels name the job (scheduler's id, user).",
        labels=JOB_INFO_LABELS,
    )
    idle = GaugeMetricFamily(
        "gpuwatch_gpu_allocated_idle_seconds",
        "How long the GPU, held by a job, has computed nothing (utilization at most 1%) "
        "without a break; 0 while it computes.",
        labels=IDLE_LABELS,
    )
    pods = GaugeMetricFamily(
        "gpuwatch_gpu_pod_info",
        "Always 1, for each GPU or MIG device a Kubernetes pod holds; the labels name the pod "
        "(its namespace, name and container).",
        labels=POD_INFO_LABELS,
    )
    if snapshot is not None and jobs.table is not None:
        for gpu in snapshot.gpus:
            job = jobs.table.job_of_gpu(gpu)
            if job is None:
                continue
            labels = [str(gpu.index), gpu.uuid or "", node]
            if job.pod is None:
                info.add_metric([*labels, job.job_id, job.user or ""], 1)
            seconds = jobs.allocated_idle_s.get(gpu.uuid or "")
            if view.current and seconds is not None:
                idle.add_metric(labels, seconds)
        for label, uuid, pod in _pods_on(snapshot, jobs.table):
            pods.add_metric([label, uuid, node, pod.namespace, pod.name, pod.container], 1)
    yield info
    yield pods
    yield idle


def _pods_on(snapshot: Snapshot, table: JobTable) -> Iterator[tuple[str, str, Pod]]:
    """(`gpu` label, uuid, pod) of each GPU and MIG device a pod holds."""
    devices: list[Device] = [*snapshot.gpus, *snapshot.mig_devices]
    for device in devices:
        job = table.job_of_device(device)
        if job is not None and job.pod is not None and device.uuid:
            label = device.label if isinstance(device, MigDevice) else str(device.index)
            yield label, device.uuid, job.pod
