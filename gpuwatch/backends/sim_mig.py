"""MIG on the simulated node: a `[[gpu]]` with `mig = ["3g.40gb", "1g.10gb"]` is MIG-enabled.

Its MIG devices are numbered in list order; a `[[process]]` on it names its
device with `mig = N`. As on a driver, a MIG-enabled GPU reports no
utilization, and a MIG device's memory is about 97.5% of its profile's share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gpuwatch.errors import InvalidValueError, ScenarioError
from gpuwatch.models import MigDevice, ProcessUsage
from gpuwatch.units import check_mig

MAX_MIG_DEVICES = 7
_MIB = 1 << 20


def check_profiles(where: str, profiles: Sequence[str]) -> tuple[str, ...]:
    """The `mig` list of a `[[gpu]]`, checked: profiles, at most 7 devices and 7 compute slices."""
    for profile in profiles:
        try:
            if check_mig(profile) == "any":
                raise InvalidValueError("any is no profile")
        except InvalidValueError:
            raise ScenarioError(
                f"{where}.mig: {profile!r} is not a MIG profile such as 1g.10gb"
            ) from None
    slices = sum(_compute_slices(profile) for profile in profiles)
    if len(profiles) > MAX_MIG_DEVICES or slices > MAX_MIG_DEVICES:
        raise ScenarioError(
            f"{where}.mig: a GPU holds at most {MAX_MIG_DEVICES} MIG devices and "
            f"{MAX_MIG_DEVICES} compute slices, not {len(profiles)} and {slices}"
        )
    return tuple(profiles)


def check_process_mig(where: str, mig: object, profiles: Sequence[str]) -> int | None:
    """A `[[process]]`'s `mig` index: required on a MIG-enabled GPU, refused on others."""
    if mig is None:
        if profiles:
            raise ScenarioError(f"{where}: its GPU is MIG-enabled; say which device, e.g. mig = 0")
        return None
    if isinstance(mig, bool) or not isinstance(mig, int) or not 0 <= mig < len(profiles):
        raise ScenarioError(
            f"{where}.mig: no MIG device {mig!r} on its GPU (it has {len(profiles)})"
        )
    return mig


def mig_uuid(gpu_uuid: str, index: int) -> str:
    """A stable `MIG-` UUID for a GPU's MIG device."""
    digest = hashlib.sha1(f"{gpu_uuid}:mig:{index}".encode()).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def mig_devices(
    gpu_index: int,
    gpu_uuid: str,
    gpu_name: str,
    profiles: Sequence[str],
    processes: Sequence[ProcessUsage],
) -> tuple[MigDevice, ...]:
    devices = []
    for index, profile in enumerate(profiles):
        uuid = mig_uuid(gpu_uuid, index)
        total = _memory_bytes(profile)
        used = min(total, sum(p.memory_used_bytes or 0 for p in processes if p.mig_uuid == uuid))
        devices.append(
            MigDevice(
                gpu_index=gpu_index,
                index=index,
                uuid=uuid,
                name=f"{gpu_name} MIG {profile}",
                profile=profile,
                gpu_instance_id=index + 1,
                compute_instance_id=0,
                memory_total_bytes=total,
                memory_used_bytes=used,
                memory_free_bytes=total - used,
            )
        )
    return tuple(devices)


def _compute_slices(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


def _memory_bytes(profile: str) -> int:
    """97.5% of the profile's GB, rounded down to 128 MiB: 9984 MiB for 1g.10gb."""
    gigabytes = int(profile.split(".", 1)[1].split("gb", 1)[0])
    return int(gigabytes * 1024 * 0.975) // 128 * 128 * _MIB
