"""CUDA_VISIBLE_DEVICES: reading the one a job was given, writing the one its child gets.

CUDA numbers GPUs "fastest first" unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`;
NVML and nvidia-smi number them in PCI bus order. Handing a child indices
without fixing the order can give it the wrong GPUs on a node with mixed
models, so gpuwatch writes UUIDs by default, and indices only together with
`CUDA_DEVICE_ORDER=PCI_BUS_ID`. On a node of one model the two orders agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuwatch.choices import Format
from gpuwatch.errors import NoGpuError, VisibleDevicesError
from gpuwatch.models import Device, GpuSample, MigDevice, Snapshot

VARIABLE = "CUDA_VISIBLE_DEVICES"
ORDER_VARIABLE = "CUDA_DEVICE_ORDER"


def parse_visible_devices(value: str) -> tuple[str, ...]:
    """The entries of a CUDA_VISIBLE_DEVICES value, checked for form.

    Entries are indices, `GPU-` UUIDs (a unique prefix is enough, as for CUDA)
    or `MIG-` instances. As CUDA does, a negative index ends the list, so `-1`
    hides every GPU, and an empty value too.
    """
    entries: list[str] = []
    if not value.strip():
        return ()
    for raw in value.split(","):
        entry = raw.strip()
        if entry.startswith("-") and entry[1:].isdigit():
            break
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            raise VisibleDevicesError(
                f"{VARIABLE}={value!r}: {entry!r} is not a GPU index, GPU- UUID or MIG- "
                "instance; use e.g. 0,1 or GPU-8f5c..."
            )
        if entry in entries:
            raise VisibleDevicesError(f"{VARIABLE}={value!r} names {entry} twice")
        entries.append(entry)
    return tuple(entries)


def visible_entries(value: str | None) -> tuple[str, ...] | None:
    """The entries of CUDA_VISIBLE_DEVICES, `None` when it is unset.

    Raises `NoGpuError` when it is set but hides every GPU (`-1`, or empty: a
    common way to say "no GPU"), before any GPU is read.
    """
    if value is None:
        return None
    entries = parse_visible_devices(value)
    if not entries:
        raise NoGpuError(
            f"{VARIABLE}={value!r} hides every GPU from this process; unset it, or set it "
            "to the GPUs this job may use"
        )
    return entries


def resolve(
    entries: Sequence[str],
    gpus: Sequence[GpuSample],
    *,
    device_order: str | None,
    what: str = VARIABLE,
) -> frozenset[int]:
    """NVML indices of the whole GPUs that `entries` name.

    MIG devices name no whole GPU, so they add nothing here (see `resolve_mig`).
    """
    indices = set()
    by_index = {gpu.index: gpu for gpu in gpus}
    for entry in entries:
        if entry.startswith("MIG-"):
            continue
        if entry.isdigit():
            _check_index_order(entry, gpus, device_order, what)
            if int(entry) not in by_index:
                raise VisibleDevicesError(
                    f"{what}: no GPU {entry} on this machine (it has {len(gpus)})"
                )
            indices.add(int(entry))
        else:
            indices.add(_by_uuid_prefix(entry, gpus, what))
    return frozenset(indices)


def resolve_mig(
    entries: Sequence[str], snapshot: Snapshot, *, device_order: str | None, what: str = VARIABLE
) -> frozenset[str]:
    """UUIDs of the MIG devices that `entries` name: `MIG-` UUIDs (or a unique prefix),
    the `MIG-GPU-<uuid>/<gi>/<ci>` form of drivers before R470, and GPUs, which
    stand for all their MIG devices."""
    found: set[str] = set()
    gpu_entries = [entry for entry in entries if not entry.startswith("MIG-")]
    parents = resolve(gpu_entries, snapshot.gpus, device_order=device_order, what=what)
    found.update(str(m.uuid) for m in snapshot.mig_devices if m.gpu_index in parents and m.uuid)
    for entry in entries:
        if entry.startswith("MIG-"):
            found.add(_mig_by_name(entry, snapshot, what))
    return frozenset(found)


def child_environment(
    chosen: Iterable[Device], fmt: Format, environ: Mapping[str, str]
) -> dict[str, str]:
    """A copy of `environ` in which CUDA sees exactly `chosen`, in that order.

    MIG devices are always written as UUIDs: CUDA takes no index for them.
    """
    env = dict(environ)
    gpus = list(chosen)
    if fmt is Format.UUID or any(isinstance(device, MigDevice) for device in gpus):
        env[VARIABLE] = ",".join(str(gpu.uuid) for gpu in gpus)
    else:
        env[VARIABLE] = ",".join(str(gpu.index) for gpu in gpus if isinstance(gpu, GpuSample))
        env[ORDER_VARIABLE] = "PCI_BUS_ID"
    return env


def _check_index_order(
    entry: str, gpus: Sequence[GpuSample], device_order: str | None, what: str
) -> None:
    if device_order == "PCI_BUS_ID":
        return
    models = {gpu.name for gpu in gpus if gpu.name}
    if len(models) > 1:
        raise VisibleDevicesError(
            f"{what}: index {entry} counts in CUDA's fastest-first order, which differs from "
            "nvidia-smi's on this node of mixed GPUs; use GPU UUIDs or set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )


def _by_uuid_prefix(entry: str, gpus: Sequence[GpuSample], what: str) -> int:
    matches = [gpu.index for gpu in gpus if gpu.uuid and gpu.uuid.startswith(entry)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise VisibleDevicesError(f"{what}: {entry} matches no GPU on this machine")
    raise VisibleDevicesError(f"{what}: {entry} matches GPUs {matches}; give more of the UUID")


def _mig_by_name(entry: str, snapshot: Snapshot, what: str) -> str:
    if entry.startswith("MIG-GPU-"):
        return _mig_by_instance(entry, snapshot, what)
    matches = [m.uuid for m in snapshot.mig_devices if m.uuid and m.uuid.startswith(entry)]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        raise VisibleDevicesError(f"{what}: {entry} matches no MIG device on this machine")
    raise VisibleDevicesError(f"{what}: {entry} matches {len(matches)} MIG devices; give more")


def _mig_by_instance(entry: str, snapshot: Snapshot, what: str) -> str:
    """`MIG-GPU-<uuid>/<gi>/<ci>`: the GPU's UUID and the instance ids."""
    gpu_uuid, _, ids = entry.removeprefix("MIG-").partition("/")
    gi, _, ci = ids.partition("/")
    parents = {gpu.index for gpu in snapshot.gpus if gpu.uuid == gpu_uuid}
    for mig in snapshot.mig_devices:
        if (
            mig.gpu_index in parents
            and mig.uuid
            and ((str(mig.gpu_instance_id), str(mig.compute_instance_id)) == (gi, ci))
        ):
            return mig.uuid
    raise VisibleDevicesError(f"{what}: {entry} matches no MIG device on this machine")
