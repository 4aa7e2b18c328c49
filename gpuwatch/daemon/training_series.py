"""The daemon's view of training processes: `/v1/training` and the `gpuwatch_torch_*` metrics.

Reports come from the lease directory (`gpuwatch.reports.training.read_reports`), each
checked field by field; they are read at most once a second however many
clients ask. A report names its GPU by uuid; the daemon turns that into the
NVML index (`gpu`) from its latest snapshot (a MIG device's, into its parent
GPU's), and leaves `gpu` empty when the uuid is unknown (a CPU run, or a GPU it
does not see).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwatch.models import Snapshot
from gpuwatch.paths import default_lease_dir
from gpuwatch.reports.training import TrainingReport, TrainingReports, read_reports

READ_EVERY_S = 1.0
LABELS = ("pid", "rank", "gpu", "user", "hostname")
_HELP = {
    "allocated_bytes": "Memory allocated to tensors by torch's caching allocator.",
    "allocated_peak_bytes": "Highest allocated memory since start (or the training's reset).",
    "reserved_bytes": "Memory torch's caching allocator holds from CUDA (allocated + cached).",
    "reserved_peak_bytes": "Highest reserved memory.",
    "active_bytes": "Memory in active blocks (allocated, or freed but awaiting a stream).",
    "active_peak_bytes": "Highest active memory.",
    "requested_bytes": "Memory the program asked for, before the allocator's rounding.",
    "inactive_split_bytes": "Free memory inside partly used segments: fragmentation.",
    "nvml_process_bytes": "The process's GPU memory as the driver counts it (context included).",
}


class TrainingView:
    """The latest reports, read at most once per `READ_EVERY_S`; safe from many threads."""

    def __init__(self, lease_dir: str | None = None) -> None:
        self._lease_dir = lease_dir
        self._lock = threading.Lock()
        self._cached: tuple[float, str, TrainingReports] = (-READ_EVERY_S, "", TrainingReports())

    def reports(self) -> TrainingReports:
        directory = self._lease_dir or default_lease_dir()
        with self._lock:
            read_at, read_from, found = self._cached
            if time.monotonic() - read_at >= READ_EVERY_S or read_from != directory:
                found = read_reports(directory)
                self._cached = (time.monotonic(), directory, found)
            return found


def training_body(snapshot: Snapshot | None, found: TrainingReports) -> dict[str, Any]:
    """The JSON of `/v1/training`: each report with the user, and the NVML index as `gpu`."""
    indices = training_indices(snapshot)
    return {
        "reports": [
            {**report.to_dict(), "user": report.user, "gpu": indices.get(report.gpu_uuid)}
            for report in found.reports
        ],
        "skipped": found.skipped,
    }


def training_metrics(
    found: TrainingReports, indices: dict[str | None, int], node: str
) -> Iterator[Metric]:
    """The `gpuwatch_torch_*` series of `found`, labelled with the `node`'s name."""
    families = {
        name: GaugeMetricFamily(f"gpuwatch_torch_{name}", text, labels=LABELS)
        for name, text in _HELP.items()
    }
    counters = {
        "alloc_retries": GaugeMetricFamily(
            "gpuwatch_torch_alloc_retries",
            "Times the allocator freed its cache and retried: memory pressure.",
            labels=LABELS,
        ),
        "ooms": GaugeMetricFamily(
            "gpuwatch_torch_ooms", "Out-of-memory errors in the process.", labels=LABELS
        ),
        "step": GaugeMetricFamily("gpuwatch_torch_step", "Training steps seen.", labels=LABELS),
    }
    step_time = GaugeMetricFamily(
        "gpuwatch_torch_step_seconds", "Duration of the last step.", labels=LABELS
    )
    for report in found.reports:
        labels = [*_labels(report, indices), node]
        for name, family in [*families.items(), *counters.items()]:
            if (value := getattr(report, name)) is not None:
                family.add_metric(labels, value)
        if report.step_time_s is not None:
            step_time.add_metric(labels, report.step_time_s)
    skipped = GaugeMetricFamily(
        "gpuwatch_torch_reports_skipped",
        "Training report files passed over (malformed, foreign, or of a dead process).",
        labels=("hostname",),
    )
    skipped.add_metric([node], found.skipped)
    yield from families.values()
    yield from counters.values()
    yield step_time
    yield skipped


def _labels(report: TrainingReport, indices: dict[str | None, int]) -> list[str]:
    index = indices.get(report.gpu_uuid)
    return [str(report.pid), str(report.rank), "" if index is None else str(index), report.user]


def training_indices(snapshot: Snapshot | None) -> dict[str | None, int]:
    """uuid -> NVML index; a MIG device's uuid maps to its parent GPU's index."""
    if snapshot is None:
        return {}
    indices: dict[str | None, int] = {
        mig.uuid: mig.gpu_index for mig in snapshot.mig_devices if mig.uuid is not None
    }
    indices.update({gpu.uuid: gpu.index for gpu in snapshot.gpus if gpu.uuid is not None})
    return indices
