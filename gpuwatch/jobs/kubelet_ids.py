"""The ids Kubernetes device plugins give NVIDIA GPUs and MIG devices, and the device of this
node each names, by UUID. Pure: the node's devices come from its snapshot.

The forms read, and where each comes from:

- `GPU-<uuid>`, `MIG-<uuid>`: NVML's UUIDs, the ids NVIDIA's device plugin gives every GPU
  and MIG device, whatever its `--device-id-strategy` (k8s-device-plugin,
  `internal/rm/devices.go`: `BuildDevice` sets the id to the UUID; the strategy only
  changes what the container runtime is told).
- `<id>::<n>`: replica `n` of a time-sliced or MPS-shared device (the same plugin's
  `NewAnnotatedID`), which is the device itself: every replica's pod holds it.
- `<i>`, `<i>:<j>`: a GPU by NVML index; a MIG device by its GPU's NVML index and its own
  index under the GPU (the plugin's `Device.Index`, `newMigDevice(i, j, ...)` under its
  `mixed` and `single` MIG strategies: what its `index` strategy hands the runtime). A
  plugin that names devices so to the kubelet is read alike; only a resource known to be
  NVIDIA's is read so (`index_form`): another vendor's device `0` is no GPU.
- `nvidia<n>`, `nvidia<n>/gi<m>`, either with `/vgpu<k>`: GKE's device plugin
  (GoogleCloudPlatform/container-engine-accelerators, `pkg/gpu/nvidia`): a GPU by its
  device file `/dev/nvidia<n>`, i.e. its minor number (`manager.go`); GPU instance `m` of
  that GPU, a MIG partition, named from `/proc/driver/nvidia/capabilities/gpu<n>/mig/gi<m>`
  (`mig/mig.go`); time-shared replica `k` of either (`gpusharing/gpusharing.go`), the
  device itself.

An id names a device by UUID only through the node's devices (`NodeDevices`). One that
cannot be mapped (a form not known, a GPU or GPU instance the node does not have, an index
or device file before the GPUs are known) is never taken for "no device": its `Named` says
why, and which of the node's devices it may be on (none: any of them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from gpuwatch.models import Device, MigDevice, Snapshot

UUID_PREFIXES = ("GPU-", "MIG-")
_REPLICA = re.compile(r"(.+?)::[0-9]{1,9}")
_INDEX = re.compile(r"([0-9]{1,4})(?::([0-9]{1,4}))?")
_GKE = re.compile(r"nvidia([0-9]{1,4})(?:/gi([0-9]{1,4}))?(?:/vgpu[0-9]{1,9})?")
NVIDIA_PREFIX = "nvidia.com/"
"""NVIDIA's plugin names its resources `nvidia.com/...` unless told another prefix."""
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
"""The names NVIDIA's and GKE's plugins give whole GPUs (and, under NVIDIA's `single` MIG
strategy, MIG devices), and `.shared`, the name NVIDIA's gives time-sliced replicas by
default (`renameByDefault`)."""
MIG_PREFIX = "nvidia.com/mig-"
"""NVIDIA's plugin's MIG devices under its `mixed` strategy: `nvidia.com/mig-1g.10gb`."""


class Named(msgspec.Struct, frozen=True):
    """What one device id names on this node: the devices it holds, by UUID; or, where it
    cannot be mapped, why (`problem`), and the devices it may be on (`uuids`: none, any)."""

    uuids: tuple[str, ...] = ()
    problem: str | None = None


def plain_id(device_id: str) -> str:
    """The device a replica's id names: `GPU-1::3` is `GPU-1`, `nvidia0/vgpu2` stays (its
    own form)."""
    replica = _REPLICA.fullmatch(device_id)
    return replica[1] if replica else device_id


def nvidia_form(device_id: str) -> bool:
    """Whether the id can only be an NVIDIA device's: a UUID of NVML, or GKE's name."""
    plain = plain_id(device_id)
    return plain.startswith(UUID_PREFIXES) or _GKE.fullmatch(plain) is not None


def gpu_resource(resource: str) -> bool:
    """Whether a resource's name is one the GPU plugins give GPUs or MIG devices."""
    return resource in GPU_RESOURCES or resource.startswith(MIG_PREFIX)


def index_form(resource: str, device_id: str) -> bool:
    """Whether the id is an NVML index (`0`, `0:1`) of a resource named NVIDIA's."""
    return resource.startswith(NVIDIA_PREFIX) and _INDEX.fullmatch(plain_id(device_id)) is not None


class NodeDevices:
    """This node's GPUs and MIG devices, by each name a device plugin gives them; `snapshot`
    `None`: not known yet (only a UUID is read then, as it is)."""

    def __init__(self, snapshot: Snapshot | None) -> None:
        self.known = snapshot is not None
        gpus = snapshot.gpus if snapshot is not None else ()
        migs = snapshot.mig_devices if snapshot is not None else ()
        devices: list[Device] = [*gpus, *migs]
        self._uuids = {device.uuid for device in devices if device.uuid}
        self._gpu_of_index = {gpu.index: gpu for gpu in gpus}
        self._gpu_of_minor = {gpu.minor_number: gpu for gpu in gpus if gpu.minor_number is not None}
        self._minors_told = all(gpu.minor_number is not None for gpu in gpus)
        self._mig_of_index = {(mig.gpu_index, mig.index): mig for mig in migs}
        self._migs_of_instance: dict[tuple[int, int | None], list[MigDevice]] = {}
        for mig in migs:
            self._migs_of_instance.setdefault((mig.gpu_index, mig.gpu_instance_id), []).append(mig)

    def name(self, device_id: str) -> Named:
        """The device(s) `device_id` names, read as an NVIDIA device's id."""
        plain = plain_id(device_id)
        if plain.startswith(UUID_PREFIXES):
            if plain in self._uuids or not self.known:
                return Named((plain,))
            return Named(problem=f"no device {plain} here")
        if not self.known:
            return Named(problem="the node's GPUs are not known yet")
        if gke := _GKE.fullmatch(plain):
            return self._by_device_file(int(gke[1]), None if gke[2] is None else int(gke[2]))
        if index := _INDEX.fullmatch(plain):
            return self._by_index(int(index[1]), None if index[2] is None else int(index[2]))
        return Named(problem="a form of device id gpuwatch does not know")

    def _by_device_file(self, minor: int, instance: int | None) -> Named:
        gpu = self._gpu_of_minor.get(minor)
        if gpu is None:
            unsure = (
                "" if self._minors_told else " (the driver does not tell every GPU's minor number)"
            )
            return Named(problem=f"no GPU /dev/nvidia{minor} here{unsure}")
        if gpu.uuid is None:
            return Named(problem=f"GPU /dev/nvidia{minor} tells no UUID")
        if instance is None:
            return Named((gpu.uuid,))
        found = self._migs_of_instance.get((gpu.index, instance), [])
        return _of_migs(gpu.uuid, found, f"GPU instance {instance} of GPU /dev/nvidia{minor}")

    def _by_index(self, index: int, mig_index: int | None) -> Named:
        gpu = self._gpu_of_index.get(index)
        if gpu is None:
            return Named(problem=f"no GPU of NVML index {index} here")
        if gpu.uuid is None:
            return Named(problem=f"GPU {index} tells no UUID")
        if mig_index is None:
            return Named((gpu.uuid,))
        mig = self._mig_of_index.get((index, mig_index))
        return _of_migs(gpu.uuid, [mig] if mig else [], f"MIG device {index}:{mig_index}")


def _of_migs(gpu_uuid: str, migs: Sequence[MigDevice], what: str) -> Named:
    """`migs` by UUID; where there are none, or one tells no UUID, why, on their GPU."""
    uuids = tuple(mig.uuid for mig in migs if mig.uuid)
    if not migs:
        return Named((gpu_uuid,), problem=f"no {what} here")
    if len(uuids) < len(migs):
        return Named((gpu_uuid,), problem=f"{what} tells no UUID")
    return Named(uuids)
