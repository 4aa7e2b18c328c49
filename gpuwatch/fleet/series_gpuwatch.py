"""gpuwatch's own daemon series (`gpuwatch.daemon.metrics`) as one node.

The daemon tells everything the model has for a fleet: memory in bytes, utilization
as a ratio, MIG devices, the processes with their users, and its leases as counts by
mode plus the memory the shared ones declared. Leases become synthetic `Lease`s
(pid 0, no user or command) so that placement's rules run on them as on a local
machine's: an exclusive lease holds its GPU, and the declared memory is split evenly
between a GPU's shared leases (their sum is what the rules subtract).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuwatch.fleet import mapped as m
from gpuwatch.fleet import node_work
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import GpuFields, Mapped
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessKind, ProcessUsage

_GPU_VALUES = {
    "gpuwatch_memory_total_bytes": ("memory_total_bytes", m.whole_bytes),
    "gpuwatch_memory_used_bytes": ("memory_used_bytes", m.whole_bytes),
    "gpuwatch_memory_free_bytes": ("memory_free_bytes", m.whole_bytes),
    "gpuwatch_utilization_ratio": ("utilization_pct", m.percent_of_ratio),
    "gpuwatch_temperature_celsius": ("temperature_c", m.celsius),
    "gpuwatch_power_watts": ("power_w", m.watts),
    "gpuwatch_mig_enabled": ("mig_enabled", m.flag),
}
MIG_VALUES = {
    "gpuwatch_mig_memory_total_bytes": "memory_total_bytes",
    "gpuwatch_mig_memory_used_bytes": "memory_used_bytes",
    "gpuwatch_mig_memory_free_bytes": "memory_free_bytes",
}
INDEXED = (
    "gpuwatch_memory_total_bytes",
    "gpuwatch_memory_used_bytes",
    "gpuwatch_memory_free_bytes",
    "gpuwatch_utilization_ratio",
    "gpuwatch_temperature_celsius",
    "gpuwatch_power_watts",
    "gpuwatch_sampling_up",
    *node_work.BY_NODE_OR_GPU,
)
"""Families a Prometheus source may read with only `gpu` (and the target) as labels, and
`INDEXED_LABELS` where they have them."""
INDEXED_LABELS = node_work.JOB_LABELS
"""The labels an indexed family carries besides `gpu`: a job's id and user."""
WHOLE = (
    "gpuwatch_gpu_info",
    "gpuwatch_sample_timestamp_seconds",
    "gpuwatch_process_memory_bytes",
    "gpuwatch_mig_leases",
    *MIG_VALUES,
    *node_work.HOLDER_FAMILIES,
)
"""Families read with all their labels: identity, processes, MIG devices, pods."""
ZERO = ("gpuwatch_gpu_up", node_work.HOLDERS_KNOWN)
"""Read where 0 only: a GPU the daemon cannot read (absent: it can), a scheduler that does
not tell (absent: it does, or none is read)."""
SIMULATED = "gpuwatch_simulated"
NONZERO = (
    "gpuwatch_leases",
    "gpuwatch_lease_declared_memory_bytes",
    "gpuwatch_mig_enabled",
    SIMULATED,
)
"""Read where not 0 only: most GPUs hold no lease and are not split, and most nodes are
real (absent: 0)."""
FAMILIES = (*INDEXED, *WHOLE, *ZERO, *NONZERO)
_KINDS = frozenset(kind.value for kind in ProcessKind)
AVAILABLE = "gpuwatch_memory_available_bytes"
GPU_DOWN = "the node's daemon cannot read this GPU (see gpuwatch status there)"


def mapped(
    samples: Sequence[Sample], node: str, scraped_as: Mapping[str, str] | None = None
) -> Mapped:
    """The node these daemon series describe; `node` names its synthetic leases (the
    target's labels, `scraped_as`, say nothing a daemon does not)."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_name[sample.name].append(sample)
    gpus = _gpus(by_name)
    built = tuple(fields.build() for _, fields in sorted(gpus.items()))
    mig_devices = _mig_devices(by_name)
    info = by_name["gpuwatch_gpu_info"][:1]
    stamps = [s.value for s in by_name["gpuwatch_sample_timestamp_seconds"]]
    waiters, longest_wait_s = node_work.waiting_line(by_name)
    return Mapped(
        gpus=built,
        mig_devices=mig_devices,
        processes=_processes(by_name["gpuwatch_process_memory_bytes"]),
        leases=_leases(by_name, gpus, node),
        driver_version=m.label(info[0].labels.get("driver_version")) if info else None,
        cuda_driver_version=m.label(info[0].labels.get("cuda_driver_version")) if info else None,
        data_at=max(stamps) if stamps else None,
        error=daemon_error(by_name, stamps),
        lease_waiters=waiters,
        longest_wait_s=longest_wait_s,
        jobs=node_work.gpu_jobs(by_name, set(gpus)),
        claims=node_work.claims(by_name, built, mig_devices),
        simulated=any(sample.value == 1 for sample in by_name[SIMULATED]),
    )


def available_mapped(samples: Sequence[Sample]) -> Mapped:
    """A node as `promql.verdicts` reads it: only the GPUs it would give out, each with
    its free memory and `uuid` (`gpuwatch_memory_available_bytes`: its free memory where
    it gives it out) and its utilization, its snapshot time and whether its sampling is
    current. It has no processes or leases that count: a GPU with any is not given out."""
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_name[sample.name].append(sample)
    busy = {s.labels.get("gpu"): s.value for s in by_name["gpuwatch_utilization_ratio"]}
    gpus = {}
    for sample in by_name[AVAILABLE]:
        if sample.value <= 0:
            continue  # not given out
        index, ratio = m.index_of(sample.labels.get("gpu")), busy.get(sample.labels.get("gpu"))
        if index is not None:
            gpus[index] = GpuSample(
                index,
                m.label(sample.labels.get("uuid")),
                None,
                None,
                memory_free_bytes=m.whole_bytes(sample.value),
                utilization_pct=None if ratio is None else m.percent_of_ratio(ratio),
            )
    stamps = [s.value for s in by_name["gpuwatch_sample_timestamp_seconds"]]
    return Mapped(
        gpus=tuple(gpu for _, gpu in sorted(gpus.items())),
        leases=(),
        data_at=max(stamps) if stamps else None,
        error=daemon_error(by_name, stamps),
    )


def daemon_error(by_name: Mapping[str, Sequence[Sample]], stamps: Sequence[float]) -> str | None:
    """Why a daemon's node is not up though it answered (its snapshot times `stamps`)."""
    if not stamps:
        return "its daemon has no snapshot yet"
    if any(sample.value == 0 for sample in by_name.get("gpuwatch_sampling_up", ())):
        return "its daemon's sampling is not current (see gpuwatch status there)"
    return None


def _gpus(by_name: dict[str, list[Sample]]) -> dict[int, GpuFields]:
    gpus: dict[int, GpuFields] = {}
    for sample in _identified(by_name):
        if (index := m.index_of(sample.labels.get("gpu"))) is not None:
            fields = gpus.setdefault(index, GpuFields(index))
            for field, key in (
                ("uuid", "uuid"),
                ("name", "model_name"),
                ("pci_bus_id", "pci_bus_id"),
            ):
                if fields.values.get(field) is None:
                    fields.values[field] = m.label(sample.labels.get(key))
            if sample.name == "gpuwatch_gpu_up" and sample.value != 1:
                fields.values["error"] = GPU_DOWN
    for name, (field, convert) in _GPU_VALUES.items():
        for sample in by_name[name]:
            index = m.index_of(sample.labels.get("gpu"))
            if index in gpus and "error" not in gpus[index].values:
                gpus[index].values[field] = convert(sample.value)
    return gpus


def _identified(by_name: dict[str, list[Sample]]) -> list[Sample]:
    """The series that make a GPU known: its info, its `gpu_up`, and memory series that
    carry its `uuid` (placement reads no `gpu_info`: see `promql.placed`)."""
    found = by_name["gpuwatch_gpu_info"] + by_name["gpuwatch_gpu_up"]
    for name in ("gpuwatch_memory_total_bytes", "gpuwatch_memory_free_bytes"):
        found += [sample for sample in by_name[name] if "uuid" in sample.labels]
    return found


def _mig_devices(by_name: dict[str, list[Sample]]) -> tuple[MigDevice, ...]:
    found: dict[tuple[int, str], dict[str, object]] = {}
    for name, field in MIG_VALUES.items():
        for sample in by_name[name]:
            gpu, uuid = m.index_of(sample.labels.get("gpu")), m.label(sample.labels.get("uuid"))
            if gpu is None or uuid is None:
                continue
            device = found.setdefault((gpu, uuid), {"labels": sample.labels})
            device[field] = m.whole_bytes(sample.value)
    return _numbered(found)


def _numbered(found: dict[tuple[int, str], dict[str, object]]) -> tuple[MigDevice, ...]:
    """MIG devices with an index under their GPU. The daemon does not export NVML's MIG
    index, so it is the device's rank by (GPU instance, compute instance) id: what
    `nvidia-smi -L` shows on a GPU split by profile order, and only a label here (a job is
    given a MIG device by its UUID, never by this index)."""
    devices: list[MigDevice] = []
    per_gpu: dict[int, int] = defaultdict(int)
    for (gpu, uuid), fields in sorted(found.items(), key=lambda item: _instance_ids(item[1])):
        labels = fields.pop("labels")
        assert isinstance(labels, dict)
        gi, ci = (
            m.index_of(labels.get("gpu_instance_id")),
            m.index_of(labels.get("compute_instance_id")),
        )
        devices.append(
            MigDevice(
                gpu_index=gpu,
                index=per_gpu[gpu],
                uuid=uuid,
                profile=m.label(labels.get("profile"), 32),
                gpu_instance_id=gi,
                compute_instance_id=ci,
                **fields,  # type: ignore[arg-type]
            )
        )
        per_gpu[gpu] += 1
    return tuple(sorted(devices, key=lambda device: (device.gpu_index, device.index)))


def _instance_ids(fields: dict[str, object]) -> tuple[int, int, int]:
    labels = fields["labels"]
    assert isinstance(labels, dict)
    ids = [m.index_of(labels.get(key)) for key in ("gpu", "gpu_instance_id", "compute_instance_id")]
    return (ids[0] or 0, ids[1] or 0, ids[2] or 0)


def _processes(samples: list[Sample]) -> tuple[ProcessUsage, ...]:
    processes = []
    for sample in samples:
        labels = sample.labels
        gpu, pid = m.index_of(labels.get("gpu")), labels.get("pid", "")
        if gpu is None or not (pid.isdigit() and pid.isascii() and len(pid) <= 10):
            continue
        kind = labels.get("kind", "")
        processes.append(
            ProcessUsage(
                pid=int(pid),
                gpu_index=gpu,
                gpu_uuid=m.label(labels.get("uuid")),
                memory_used_bytes=m.whole_bytes(sample.value),
                kind=ProcessKind(kind) if kind in _KINDS else ProcessKind.COMPUTE,
                user=m.label(labels.get("user"), 64),
                command=m.label(labels.get("process")),
            )
        )
    return tuple(processes)


def _leases(
    by_name: dict[str, list[Sample]], gpus: dict[int, GpuFields], node: str
) -> tuple[Lease, ...]:
    declared = {
        m.index_of(s.labels.get("gpu")): m.whole_bytes(s.value) or 0
        for s in by_name["gpuwatch_lease_declared_memory_bytes"]
    }
    leases: list[Lease] = []
    for sample in by_name["gpuwatch_leases"] + by_name["gpuwatch_mig_leases"]:
        gpu = m.index_of(sample.labels.get("gpu"))
        mig = sample.name == "gpuwatch_mig_leases"
        if gpu not in gpus:
            continue
        uuid = m.label(sample.labels.get("uuid") if mig else _str(gpus[gpu].values.get("uuid")))
        count = m.small_whole(sample.value, 1024) or 0
        if uuid is None or count == 0:
            continue
        shared = sample.labels.get("mode") == "shared"
        # A MIG device's shared leases declare memory the daemon does not export: they hold
        # no more than what its free memory already shows.
        memory = (0 if mig else declared.get(gpu, 0)) if shared else None
        leases += _synthetic(node, uuid, gpu, count, memory, sample.labels.get("mode", ""))
    return tuple(leases)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _synthetic(
    node: str, uuid: str, gpu: int, count: int, memory: int | None, mode: str
) -> list[Lease]:
    share, rest = divmod(memory, count) if memory is not None else (0, 0)
    return [
        Lease(
            gpu_uuid=uuid,
            gpu_index=gpu,
            pid=0,
            user="",
            command="",
            started_at=0.0,
            mem_bytes=None if memory is None else share + (rest if number == 0 else 0),
            lease_id=f"{node}/{uuid}/{mode}/{number}",
        )
        for number in range(count)
    ]
