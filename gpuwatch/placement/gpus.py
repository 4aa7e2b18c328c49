"""Which whole GPUs a job gets: the GPU `Kind` of the placement rules (`gpuwatch.placement.rules`).

A GPU may be given when the request's CUDA_VISIBLE_DEVICES shows it, `--exclude`
does not name it, and it is not split into MIG devices. Its utilization (now, and
over the last minute where the daemon knows it) makes it busy; two GPUs reporting
one UUID are both in error, since no lease could tell them apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from gpuwatch.models import Device, GpuSample, ProcessUsage, Snapshot
from gpuwatch.placement.mig import MIG_DEVICES
from gpuwatch.placement.rules import Candidate, Kind, place
from gpuwatch.request import Request


class _Gpus(Kind):
    mig = False
    noun = "GPU"

    def devices(self, snapshot: Snapshot) -> Sequence[Device]:
        return snapshot.gpus

    def outside(self, device: Device, request: Request) -> str | None:
        assert isinstance(device, GpuSample)
        if request.job_gpus is not None and device.index not in request.job_gpus:
            return "not this job's GPU (Slurm gave it others)"
        if request.allowed is not None and device.index not in request.allowed:
            return "not in CUDA_VISIBLE_DEVICES"
        if device.index in request.excluded:
            return "excluded"
        if device.mig_enabled:
            return "MIG enabled: it is given out only as MIG devices (use --mig PROFILE|any)"
        return None

    def processes(self, snapshot: Snapshot, device: Device) -> Sequence[ProcessUsage]:
        assert isinstance(device, GpuSample)
        return snapshot.processes_on(device.index)

    def faults(self, snapshot: Snapshot) -> dict[tuple[int, ...], str]:
        first_by_uuid: dict[str, int] = {}
        faults: dict[tuple[int, ...], str] = {}
        for gpu in snapshot.gpus:
            if gpu.uuid and (first := first_by_uuid.setdefault(gpu.uuid, gpu.index)) != gpu.index:
                faults[(gpu.index,)] = f"the driver reports the same UUID for GPU {first}"
                faults[(first,)] = f"the driver reports the same UUID for GPU {gpu.index}"
        return faults

    def name(self, device: Device) -> str:
        assert isinstance(device, GpuSample)
        return f"GPU {device.index}"

    def order(self, device: Device) -> tuple[int, ...]:
        assert isinstance(device, GpuSample)
        return (device.index,)

    def utilization_pct(self, device: Device) -> float | None:
        assert isinstance(device, GpuSample)
        return device.utilization_pct

    def busyness(self, candidate: Candidate) -> float:
        utilization = self.utilization_pct(candidate.device)
        return 100.0 if utilization is None else float(utilization)


GPUS: Kind = _Gpus()


choose = partial(place, GPUS)
"""`place(GPUS, snapshot, request, ...)`: whole GPUs for `request` (see `rules.place`)."""


def kind_for(request: Request) -> Kind:
    """The kind of device `request` asks for: whole GPUs, or MIG devices with `--mig`."""
    return GPUS if request.mig is None else MIG_DEVICES
