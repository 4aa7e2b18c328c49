"""Which MIG devices a job gets: the MIG `Kind` of the placement rules (`gpuwatch.placement.rules`).

A MIG device may be given when it is of the profile asked for (or `--mig any`),
inside the job's CUDA_VISIBLE_DEVICES and outside its `--exclude`. The driver
reports no utilization for MIG devices, so the number of other processes in one
stands in for how busy it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from gpuwatch.choices import MIG_ANY as ANY
from gpuwatch.models import Device, Lease, MigDevice, ProcessUsage, Snapshot
from gpuwatch.placement.rules import Candidate, Kind, place, usable
from gpuwatch.request import Request


class _MigDevices(Kind):
    mig = True
    noun = "MIG device"

    def devices(self, snapshot: Snapshot) -> Sequence[Device]:
        return snapshot.mig_devices

    def outside(self, device: Device, request: Request) -> str | None:
        assert isinstance(device, MigDevice)
        if request.mig_allowed is not None and device.uuid not in request.mig_allowed:
            return "not in CUDA_VISIBLE_DEVICES"
        if device.gpu_index in request.excluded or device.uuid in request.mig_excluded:
            return "excluded"
        if request.mig not in (None, ANY) and device.profile != request.mig:
            return f"profile {device.profile or 'unknown'}, not {request.mig}"
        return None

    def processes(self, snapshot: Snapshot, device: Device) -> Sequence[ProcessUsage]:
        assert isinstance(device, MigDevice)
        return snapshot.processes_in(device)

    def name(self, device: Device) -> str:
        assert isinstance(device, MigDevice)
        return f"MIG {device.label} ({device.profile or '?'})"

    def order(self, device: Device) -> tuple[int, ...]:
        assert isinstance(device, MigDevice)
        return (device.gpu_index, device.index)

    def identified(self, device: Device) -> bool:
        """Its UUID, or where an exporter tells none (dcgm-exporter), its GPU instance
        under its GPU: as Kubernetes' device plugin gives it, not by UUID."""
        assert isinstance(device, MigDevice)
        return device.uuid is not None or device.gpu_instance_id is not None

    def busyness(self, candidate: Candidate) -> float:
        return float(sum(1 for p in candidate.processes if p.pid not in candidate.own_pids))


MIG_DEVICES: Kind = _MigDevices()


choose_mig = partial(place, MIG_DEVICES)
"""`place(MIG_DEVICES, snapshot, request, ...)`: MIG devices for `request` (see `rules.place`)."""


def usable_mig_devices(snapshot: Snapshot, request: Request) -> list[MigDevice]:
    """The MIG devices `request` may ever have: of its profile, allowed and not excluded."""
    return [
        device for device in usable(MIG_DEVICES, snapshot, request) if isinstance(device, MigDevice)
    ]


def free_mig_devices(snapshot: Snapshot, leases: Sequence[Lease]) -> int:
    """How many MIG devices `--mig any` could have now: for the hint when no whole GPU can."""
    return choose_mig(snapshot, Request(mig=ANY), leases=leases).qualifying


def stale_mig_leases(snapshot: Snapshot, leases: Sequence[Lease]) -> list[Lease]:
    """Leases of MIG devices that are gone: their GPU reads, its MIG devices are all known,
    and the leased one is not among them (the GPU was reconfigured, or left MIG mode).

    Only leases older than the snapshot count: a snapshot from the daemon may predate a MIG
    device created since, and leased by a picker that read the driver itself.
    """
    present = {device.uuid for device in snapshot.mig_devices}
    known = {gpu.index for gpu in snapshot.gpus if gpu.mig_enabled is not None}
    return [
        lease
        for lease in leases
        if lease.gpu_uuid.startswith("MIG-")
        and lease.gpu_index in known
        and lease.gpu_uuid not in present
        and lease.started_at < snapshot.taken_at
    ]
