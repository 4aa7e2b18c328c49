"""dcgm-exporter's series (`DCGM_FI_*`, NVIDIA/dcgm-exporter `etc/default-counters.csv`)
as one node.

Labels: `gpu` (the NVML index), `UUID` (`uuid` with `--use-old-namespace`),
`modelName`, `pci_bus_id`, `Hostname` or `hostname`; on a MIG-enabled GPU, series come
per GPU instance with `GPU_I_ID` and `GPU_I_PROFILE` (memory in 3.x and later; 2.x
exports none for a MIG device, only its profiling and XID series): any series of a GPU
instance makes its GPU MIG-enabled, never given out whole. Framebuffer figures are whole
MiB. On Kubernetes a GPU (or GPU instance) held by a pod carries the pod's `pod`,
`namespace` and `container`; Prometheus renames those `exported_pod` and so on where its
own target labels (the exporter pod's) take the names, and adds the target's to every
series where the exporter's own win (`honor_labels`): a pod is the exported one, else a
`pod` that is not the target's own. DCGM tells nothing of leases (`leases` stays `None`)
and, in the default counters, nothing of processes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import Claims, GpuFields, Mapped
from gpuwatch.fleet.names import safe_name
from gpuwatch.fleet_model import GpuPod
from gpuwatch.holders import Holder, HolderKind, device_key, holder_problem
from gpuwatch.models import GpuSample, MigDevice

_FB = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")
_VALUES = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_pct", m.percent),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("memory_utilization_pct", m.percent),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", m.celsius),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", m.watts),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", m.megahertz),
}
INDEXED = (*_FB, "DCGM_FI_DEV_FB_TOTAL", *_VALUES)
"""Families a Prometheus source may read with only `gpu` and `GPU_I_ID` as labels."""
FAMILIES = INDEXED
SEEN = (
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
)
"""Families of the default counters in which dcgm-exporter tells each GPU and GPU
instance: 2.x exports a GPU instance's XID errors and no memory, 3.x and later its
memory (and temperatures)."""
DEVICES = "DCGM_FI_DEVICES"
"""Not a family: the name a Prometheus source gives each GPU and GPU instance it finds
in any family, with its identity, host and pod labels (`promql.DCGM_DEVICES`): 2.x
exports no memory of a GPU instance, and a page may lack any one family."""
DEVICE_LABELS = (
    "gpu",
    "GPU_I_ID",
    "GPU_I_PROFILE",
    "UUID",
    "uuid",
    "modelName",
    "pci_bus_id",
    "Hostname",
    "hostname",
    "DCGM_FI_DRIVER_VERSION",
)
POD_LABELS = (
    "pod",
    "namespace",
    "container",
    "exported_pod",
    "exported_namespace",
    "exported_container",
)
_POD_CHARS = 253


def mapped(
    samples: Sequence[Sample], node: str, scraped_as: Mapping[str, str] | None = None
) -> Mapped:
    """The node these dcgm-exporter series describe; `scraped_as`: the labels Prometheus
    gave every series of the target (its `up`'s), whose `pod` is no workload's."""
    gpus: dict[int, GpuFields] = {}
    instances: dict[tuple[int, int], dict[str, int | str | None]] = defaultdict(dict)
    pods: dict[tuple[int, int | None], dict[GpuPod, None]] = defaultdict(dict)
    for sample in samples:
        index = m.index_of(sample.labels.get("gpu"))
        if index is None:
            continue
        fields = gpus.setdefault(index, GpuFields(index))
        _identify(fields, sample.labels)
        instance = m.index_of(sample.labels.get("GPU_I_ID"))
        if (pod := pod_of(index, instance, sample.labels, scraped_as or {})) is not None:
            pods[(index, instance)][pod] = None  # each pod of a shared device, once
        if instance is not None:
            fields.values["mig_enabled"] = True
            _memory(instances[(index, instance)], sample)
            if profile := sample.labels.get("GPU_I_PROFILE"):
                instances[(index, instance)]["profile"] = profile
        elif sample.name in _VALUES:
            field, convert = _VALUES[sample.name]
            fields.values[field] = convert(sample.value)
        else:
            _memory(fields.values, sample)  # type: ignore[arg-type]
    for fields in gpus.values():
        _total(fields.values)  # type: ignore[arg-type]
    versions = (s.labels.get("DCGM_FI_DRIVER_VERSION") for s in samples)
    driver = next((version for version in versions if version), None)
    built = tuple(fields.build() for _, fields in sorted(gpus.items()))
    mig_devices = _mig_devices(instances)
    ordered = tuple(
        pod for _, held in sorted(pods.items(), key=lambda i: _order(i[0])) for pod in held
    )
    return Mapped(
        gpus=built,
        mig_devices=mig_devices,
        driver_version=m.label(driver, 64),
        claims=pod_claims(ordered, built, mig_devices),
    )


def pod_claims(
    pods: Sequence[GpuPod], gpus: Sequence[GpuSample], mig_devices: Sequence[MigDevice]
) -> Claims:
    """The pods as the holders of their devices: a pod labelled on a GPU instance holds
    that MIG device, else the whole GPU; one whose names cannot be believed makes its
    device unknown."""
    keys: dict[tuple[int, int | None], str] = {(gpu.index, None): device_key(gpu) for gpu in gpus}
    keys.update({(d.gpu_index, d.gpu_instance_id): device_key(d) for d in mig_devices})
    held: dict[str, list[Holder]] = defaultdict(list)
    unknown: dict[str, str] = {}
    for pod in pods:
        key = keys.get((pod.gpu_index, pod.gpu_instance_id)) or keys.get((pod.gpu_index, None))
        if key is None:
            continue
        why = holder_problem(HolderKind.POD, pod.name, None, pod.container)
        if why is not None:
            unknown[key] = f"its exporter names a pod that cannot be believed ({why})"
        else:
            held[key].append(Holder(HolderKind.POD, pod.name, container=pod.container))
    return Claims({key: tuple(found) for key, found in held.items()}, unknown)


def pod_of(
    gpu: int, instance: int | None, labels: Mapping[str, str], scraped_as: Mapping[str, str]
) -> GpuPod | None:
    """The pod a series says holds its GPU (or GPU instance), or `None`: the exported pod
    where Prometheus renamed it, else a `pod` label other than the target's own."""
    if pod := labels.get("exported_pod"):
        namespace, container = labels.get("exported_namespace"), labels.get("exported_container")
    else:
        pod, namespace, container = (labels.get(key) for key in POD_LABELS[:3])
        own = (scraped_as.get("pod"), scraped_as.get("namespace"))
        if not pod or (pod, namespace) == own:
            return None
    return GpuPod(
        gpu_index=gpu,
        namespace=_text(namespace) or "",
        pod=_text(pod) or "",
        container=_text(container),
        gpu_instance_id=instance,
    )


def _text(value: str | None) -> str | None:
    return safe_name(value[:_POD_CHARS]) if value else None


def _order(key: tuple[int, int | None]) -> tuple[int, int]:
    return (key[0], -1 if key[1] is None else key[1])


def _identify(fields: GpuFields, labels: dict[str, str]) -> None:
    """The GPU's identity, from the first series that carries it."""
    for field, keys in (
        ("uuid", ("UUID", "uuid")),
        ("name", ("modelName",)),
        ("pci_bus_id", ("pci_bus_id",)),
    ):
        if fields.values.get(field) is None:
            fields.values[field] = m.label(next((labels[k] for k in keys if labels.get(k)), None))


def _memory(values: dict[str, int | str | None], sample: Sample) -> None:
    key = {
        "DCGM_FI_DEV_FB_FREE": "memory_free_bytes",
        "DCGM_FI_DEV_FB_USED": "memory_used_bytes",
        "DCGM_FI_DEV_FB_RESERVED": "memory_reserved_bytes",
        "DCGM_FI_DEV_FB_TOTAL": "memory_total_bytes",
    }.get(sample.name)
    if key is not None:
        values[key] = m.whole_bytes(sample.value, m.MIB)


def _total(values: dict[str, int | str | None]) -> None:
    """Total memory, where DCGM defines it. `DCGM_FI_DEV_FB_TOTAL` is not a default
    counter. DCGM reads all four from one NVML call (DcgmCacheManager.cpp,
    ReadAndCacheFBMemoryInfo): from driver 510 on, `nvmlDeviceGetMemoryInfo_v2`, whose
    total is used + free + reserved, and only then does it report FB_RESERVED; before,
    the v1 call, where used includes what is reserved. So without FB_RESERVED, used +
    free is the total on old drivers but not on a new driver whose exporter does not
    export FB_RESERVED: then the total is not known. Each figure is whole MiB, rounded
    down, so the sum may be up to 3MiB short."""
    if values.get("memory_total_bytes") is not None:
        return
    parts = [values.get(key) for key in _memory_keys()]
    if all(isinstance(part, int) for part in parts):
        values["memory_total_bytes"] = sum(part for part in parts if isinstance(part, int))


def _memory_keys() -> tuple[str, ...]:
    return ("memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes")


def _mig_devices(
    instances: dict[tuple[int, int], dict[str, int | str | None]],
) -> tuple[MigDevice, ...]:
    """A device per GPU instance, numbered under its GPU by instance id (DCGM exports
    neither NVML's MIG index nor the MIG device's UUID)."""
    devices = []
    numbers: dict[int, int] = defaultdict(int)
    for (gpu, instance), values in sorted(instances.items()):
        _total(values)
        total = values.get("memory_total_bytes")
        devices.append(
            MigDevice(
                gpu_index=gpu,
                index=numbers[gpu],
                uuid=None,
                profile=m.label(str(values.get("profile") or ""), 32),
                gpu_instance_id=instance,
                memory_total_bytes=total if isinstance(total, int) else None,
                memory_used_bytes=_int(values.get("memory_used_bytes")),
                memory_free_bytes=_int(values.get("memory_free_bytes")),
            )
        )
        numbers[gpu] += 1
    return tuple(devices)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None
