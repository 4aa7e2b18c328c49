"""nvidia_gpu_exporter's series (`nvidia_smi_*`, utkuozdemir/nvidia_gpu_exporter
`docs/METRICS.md`) as one node.

Every per-GPU series carries only `uuid`, joined to `nvidia_smi_gpu_info{uuid, name,
index, pci_bus_id, driver_version, cuda_version}`. The exporter writes the UUID
lower-case without its `GPU-` prefix (`NormalizeUUID` in internal/nvidiasmi), and a MIG
device's without `MIG-`; both are given back, as CUDA_VISIBLE_DEVICES takes them.
Memory comes in bytes with its own total (nvidia-smi's `memory.total`), utilization as
a ratio. No leases, and processes only with `--collect.compute-apps`, without users: each
`nvidia_smi_compute_app_info` is one (on Windows, where the driver tells no process's
memory, the only series of it), with its memory where `..._used_memory_bytes` tells it. MIG
devices come only from its NVML backend (`nvidia_smi_mig_info`): where a GPU is in MIG
mode (`nvidia_smi_mig_mode_current`) and no device is told, its devices are unknown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import GpuFields, Mapped
from gpuwatch.models import MigDevice, ProcessKind, ProcessUsage

_VALUES = {
    "nvidia_smi_memory_total_bytes": ("memory_total_bytes", m.whole_bytes),
    "nvidia_smi_memory_used_bytes": ("memory_used_bytes", m.whole_bytes),
    "nvidia_smi_memory_free_bytes": ("memory_free_bytes", m.whole_bytes),
    "nvidia_smi_utilization_gpu_ratio": ("utilization_pct", m.percent_of_ratio),
    "nvidia_smi_temperature_gpu": ("temperature_c", m.celsius),
    "nvidia_smi_power_draw_watts": ("power_w", m.watts),
    "nvidia_smi_mig_mode_current": ("mig_enabled", m.flag),
}
_MIG_MEMORY = {
    "nvidia_smi_mig_memory_total_bytes": "memory_total_bytes",
    "nvidia_smi_mig_memory_used_bytes": "memory_used_bytes",
    "nvidia_smi_mig_memory_free_bytes": "memory_free_bytes",
}
APP_INFO = "nvidia_smi_compute_app_info"
APP_MEMORY = "nvidia_smi_compute_app_used_memory_bytes"
BY_UUID = tuple(_VALUES)
"""Families a Prometheus source may read with only `uuid` (and the target) as labels."""
WHOLE = (
    "nvidia_smi_gpu_info",
    "nvidia_smi_last_collect_success",
    "nvidia_smi_last_collect_success_timestamp_seconds",
    APP_INFO,
    APP_MEMORY,
    "nvidia_smi_mig_info",
    *_MIG_MEMORY,
)
FAMILIES = (*BY_UUID, *WHOLE)


def mapped(
    samples: Sequence[Sample], node: str, scraped_as: Mapping[str, str] | None = None
) -> Mapped:
    """The node these nvidia_gpu_exporter series describe."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_name[sample.name].append(sample)
    info = {
        s.labels["uuid"]: s.labels for s in by_name["nvidia_smi_gpu_info"] if s.labels.get("uuid")
    }
    indices = _indices(info)
    gpus = {uuid: _identity(index, info[uuid]) for uuid, index in indices.items()}
    for name, (field, convert) in _VALUES.items():
        for sample in by_name[name]:
            if (fields := gpus.get(sample.labels.get("uuid", ""))) is not None:
                fields.values[field] = convert(sample.value)
    stamps = [s.value for s in by_name["nvidia_smi_last_collect_success_timestamp_seconds"]]
    failed = any(s.value == 0 for s in by_name["nvidia_smi_last_collect_success"])
    first = next(iter(info.values()), {})
    built = sorted((f.build() for f in gpus.values()), key=lambda gpu: gpu.index)
    mig_devices = _mig_devices(by_name, indices)
    return Mapped(
        gpus=tuple(built),
        mig_devices=mig_devices,
        mig_devices_known=bool(mig_devices) or not any(gpu.mig_enabled for gpu in built),
        processes=_processes(by_name[APP_INFO], by_name[APP_MEMORY], indices),
        driver_version=m.label(first.get("driver_version")),
        cuda_driver_version=m.label(first.get("cuda_version")),
        data_at=max(stamps) if stamps else None,
        error="nvidia-smi failed on the node at its last collection" if failed else None,
    )


def _indices(info: dict[str, dict[str, str]]) -> dict[str, int]:
    """Each GPU's NVML index: the `index` label, else its rank in PCI bus order, which is
    how NVML numbers GPUs."""
    indices = {uuid: m.index_of(labels.get("index")) for uuid, labels in info.items()}
    if all(index is not None for index in indices.values()) and len(set(indices.values())) == len(
        indices
    ):
        return {uuid: index for uuid, index in indices.items() if index is not None}
    by_bus = sorted(info, key=lambda uuid: (info[uuid].get("pci_bus_id", "").lower(), uuid))
    return {uuid: rank for rank, uuid in enumerate(by_bus)}


def _identity(index: int, labels: dict[str, str]) -> GpuFields:
    fields = GpuFields(index)
    fields.values["uuid"] = _prefixed("GPU-", labels.get("uuid"))
    fields.values["name"] = m.label(labels.get("name"))
    fields.values["pci_bus_id"] = m.label(labels.get("pci_bus_id"))
    return fields


def _prefixed(prefix: str, uuid: str | None) -> str | None:
    if not uuid:
        return None
    return uuid[:128] if uuid.lower().startswith(prefix.lower()) else prefix + uuid[:128]


def _mig_devices(
    by_name: dict[str, list[Sample]], indices: dict[str, int]
) -> tuple[MigDevice, ...]:
    """One device per `nvidia_smi_mig_info`; its memory is its GPU instance's (the
    exporter reports memory per GPU instance, shared by its compute instances)."""
    memory: dict[tuple[str, str], dict[str, int | None]] = defaultdict(dict)
    for name, field in _MIG_MEMORY.items():
        for sample in by_name[name]:
            key = (sample.labels.get("uuid", ""), sample.labels.get("gpu_instance_id", ""))
            memory[key][field] = m.whole_bytes(sample.value)
    devices = []
    numbers: dict[int, int] = defaultdict(int)
    infos = sorted(by_name["nvidia_smi_mig_info"], key=lambda s: _ids(s.labels))
    for sample in infos:
        labels = sample.labels
        gpu = indices.get(labels.get("uuid", ""))
        if gpu is None:
            continue
        memory_of = memory.get((labels.get("uuid", ""), labels.get("gpu_instance_id", "")), {})
        devices.append(
            MigDevice(
                gpu_index=gpu,
                index=numbers[gpu],
                uuid=_prefixed("MIG-", labels.get("mig_uuid")),
                profile=m.label(labels.get("profile"), 32),
                gpu_instance_id=m.index_of(labels.get("gpu_instance_id")),
                compute_instance_id=m.index_of(labels.get("compute_instance_id")),
                memory_total_bytes=memory_of.get("memory_total_bytes"),
                memory_used_bytes=memory_of.get("memory_used_bytes"),
                memory_free_bytes=memory_of.get("memory_free_bytes"),
            )
        )
        numbers[gpu] += 1
    return tuple(devices)


def _ids(labels: dict[str, str]) -> tuple[str, int, int]:
    gi, ci = (m.index_of(labels.get(k)) for k in ("gpu_instance_id", "compute_instance_id"))
    return (labels.get("uuid", ""), gi or 0, ci or 0)


def _processes(
    infos: list[Sample], memory: list[Sample], indices: dict[str, int]
) -> tuple[ProcessUsage, ...]:
    """One process per (GPU, pid) that either family names: a compute process holds its
    GPU whether or not the driver tells its memory."""
    found: dict[tuple[str, str], ProcessUsage] = {}
    for sample in [*infos, *memory]:
        uuid, pid = sample.labels.get("uuid", ""), sample.labels.get("pid", "")
        if uuid not in indices or not (pid.isdigit() and pid.isascii() and len(pid) <= 10):
            continue
        used = m.whole_bytes(sample.value) if sample.name == APP_MEMORY else None
        known = found.get((uuid, pid))
        if known is not None and used is None:
            continue
        found[(uuid, pid)] = ProcessUsage(
            pid=int(pid),
            gpu_index=indices[uuid],
            gpu_uuid=_prefixed("GPU-", uuid),
            memory_used_bytes=used,
            kind=ProcessKind.COMPUTE,
            command=m.label(sample.labels.get("process_name")),
        )
    return tuple(found.values())
