"""What a job wants, before GPU names are resolved against the machine: `Wanted`, the one
way `gpuwatch pick` and `gpuwatch.select()` state a job's wishes, and its `resolve()` into
the request the placement rules run (NVML indices, the GPUs a Slurm step may have, what no
waiting could ever give refused at once).

The caller reads its own environment (`wanted(..., environ=...)`): CUDA_VISIBLE_DEVICES,
its order, and inside a Slurm job the step's GPUs, read by `gpuwatch.placement.slurmstep`
through a small registry (`STEP`), so that a job outside Slurm loads no gres.conf reader.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import msgspec
from msgspec.structs import replace

from gpuwatch.choices import MIG_ANY as ANY
from gpuwatch.choices import named, said
from gpuwatch.errors import InvalidValueError, NoGpuError, NotEnoughGpusError
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.placement.gpus import GPUS
from gpuwatch.placement.mig import MIG_DEVICES, usable_mig_devices
from gpuwatch.placement.rules import Kind, Never, never
from gpuwatch.placement.visible import (
    ORDER_VARIABLE,
    VARIABLE,
    resolve,
    resolve_mig,
    visible_entries,
)
from gpuwatch.request import Request, describe_wish
from gpuwatch.units import counted, format_size

OnNote = Callable[[str], None]
"""Told, in one line, of something the job should know but that does not stop it."""
STEP = "gpuwatch.placement.slurmstep:slurm_step"
"""Reads the Slurm job or step a process runs in from its environment (gres.conf and all):
opened only inside one."""


class StepGpus(Protocol):
    """The GPUs a Slurm job or step was given (`gpuwatch.placement.slurmstep.SlurmStep`)."""

    @property
    def said(self) -> str:
        """`SLURM_STEP_GPUS=0,2`, for messages."""

    def allowed(
        self, gpus: Sequence[GpuSample], visible: Sequence[str] | None, *, device_order: str | None
    ) -> tuple[frozenset[int], str | None]:
        """The NVML indices a job in the step may have, and a note where
        CUDA_VISIBLE_DEVICES or the step's device cgroup says otherwise than gres.conf."""

    def given(self, gpus: Sequence[GpuSample]) -> frozenset[int]:
        """The NVML indices of the step's GPUs among `gpus`."""


def wanted(
    asked: Request, exclude: tuple[str, ...], *, environ: Mapping[str, str], by_pick: bool
) -> Wanted:
    """What a job wants: `asked` (checked already), `exclude` as `choices.exclude_entries`
    reads it, and from `environ` (the caller's environment) CUDA_VISIBLE_DEVICES, its order
    and, inside a Slurm job or step, its GPUs (not for MIG devices). `by_pick`: speak of the
    wishes as pick writes them."""
    found = Wanted(
        asked=asked,
        exclude=exclude,
        visible=visible_entries(environ.get(VARIABLE)),
        device_order=environ.get(ORDER_VARIABLE),
        by_pick=by_pick,
    )
    if found.wants_mig or not environ.get("SLURM_JOB_ID"):
        return found
    module, name = STEP.split(":")
    step: StepGpus | None = getattr(importlib.import_module(module), name)(environ)
    return replace(found, slurm=step)


class Wanted(msgspec.Struct, frozen=True):
    """A job's wishes as written, before GPU names are resolved against the machine."""

    asked: Request = msgspec.field(default_factory=Request)
    """Everything but the GPU sets, which `resolve()` fills in."""
    exclude: tuple[str, ...] = ()
    visible: tuple[str, ...] | None = None
    """The CUDA_VISIBLE_DEVICES entries in force; `None` when it is unset."""
    device_order: str | None = None
    slurm: StepGpus | None = None
    """The Slurm job or step this process runs in, whose GPUs are the ones to choose from;
    `None` outside one (see `gpuwatch.placement.slurmstep`)."""

    by_pick: bool = True
    """Speak of the wishes as `gpuwatch pick` writes them (`--exclude`), else as
    `gpuwatch.select()` does (`exclude`)."""

    @property
    def wants_mig(self) -> bool:
        """MIG devices are wanted: asked for, or all that CUDA_VISIBLE_DEVICES names
        (as Slurm and Kubernetes hand out MIG devices)."""
        visible = self.visible or ()
        return self.asked.mig is not None or (
            bool(visible) and all(entry.startswith("MIG-") for entry in visible)
        )

    @property
    def needs_names(self) -> bool:
        """Whether GPUs must be sampled with their names and minor numbers: index entries
        in CUDA's default order can be trusted only on a node of one model, and a Slurm
        step's GPUs are known by minor number."""
        indices = any(e.isdigit() for e in self.visible or ())
        return self.slurm is not None or (self.device_order != "PCI_BUS_ID" and indices)

    def resolve(self, snapshot: Snapshot, on_note: OnNote | None = None) -> Request:
        """The request in NVML indices; refuses one that no amount of waiting could meet."""
        if self.wants_mig:
            return self._resolve_mig(snapshot)
        gpus = snapshot.gpus
        job_gpus = None
        if self.slurm is not None:
            allowed, note = self.slurm.allowed(gpus, self.visible, device_order=self.device_order)
            job_gpus = self.slurm.given(gpus)
            if note is not None and on_note is not None:
                on_note(note)
        elif self.visible is not None:
            allowed = resolve(self.visible, gpus, device_order=self.device_order)
        else:
            allowed = None
        if allowed is not None and not allowed:
            raise NoGpuError(
                f"{VARIABLE}={','.join(self.visible or ()) or '(empty)'} leaves no "
                "whole GPU to choose from"
            )
        excluded = resolve(
            self.exclude, gpus, device_order="PCI_BUS_ID", what=self._named("exclude")
        )
        request = replace(self.asked, allowed=allowed, excluded=excluded, job_gpus=job_gpus)
        if (why := never(GPUS, snapshot, request)) is None:
            return request
        if why.usable >= request.count:
            raise InvalidValueError(_too_small(GPUS, request, why))
        # GPUs in MIG mode are not given whole: too few outside it is said per GPU, with the
        # MIG devices to use instead, as any shortfall (`acquire` waits for none).
        usable = (allowed if allowed is not None else {gpu.index for gpu in gpus}) - excluded
        if request.count > len(usable):
            left = f" after {self._named('exclude')}" if excluded else ""
            raise InvalidValueError(
                f"{counted(request.count, 'GPU')} asked for, but "
                f"{self._has(allowed, len(usable))}{left}"
            )
        return request

    def _has(self, allowed: frozenset[int] | None, usable: int) -> str:
        """`this machine has 2`: what limits the GPUs to choose from, and to how many."""
        if self.slurm is not None:
            return f"this Slurm job has {usable} ({self.slurm.said})"
        return f"{'this machine has' if allowed is None else f'{VARIABLE} allows'} {usable}"

    def _resolve_mig(self, snapshot: Snapshot) -> Request:
        mig = self.asked.mig or ANY
        if not snapshot.mig_devices:
            if self.asked.mig is None:
                raise NoGpuError(
                    f"{VARIABLE} names only MIG devices, but no GPU on this machine has any"
                )
            raise NotEnoughGpusError(
                f"{self._said('mig', mig)}: no GPU on this machine has MIG devices",
                tuple(f"GPU {gpu.index}: MIG not enabled" for gpu in snapshot.gpus),
            )
        if self.asked.max_util_pct is not None:
            raise InvalidValueError(
                f"{self._named('max_util_pct')}: MIG devices report no utilization; leave it out"
            )
        allowed = None
        if self.visible is not None:
            allowed = resolve_mig(self.visible, snapshot, device_order=self.device_order)
            if not allowed:
                raise NoGpuError(f"{VARIABLE}={','.join(self.visible)} names no MIG device")
        whole = tuple(entry for entry in self.exclude if not entry.startswith("MIG-"))
        excluded = resolve(
            whole, snapshot.gpus, device_order="PCI_BUS_ID", what=self._named("exclude")
        )
        mig_excluded = resolve_mig(
            tuple(e for e in self.exclude if e.startswith("MIG-")),
            snapshot,
            device_order="PCI_BUS_ID",
            what=self._named("exclude"),
        )
        request = replace(
            self.asked, mig=mig, mig_allowed=allowed, mig_excluded=mig_excluded, excluded=excluded
        )
        any_profile = usable_mig_devices(snapshot, replace(request, mig=ANY))
        profiles = sorted({str(device.profile) for device in any_profile if device.profile})
        if mig != ANY and mig not in profiles:
            raise InvalidValueError(
                f"{self._said('mig', mig)}: no MIG device of that profile to choose from; "
                f"there are: {', '.join(profiles) or 'none'} (or use {self._said('mig', ANY)})"
            )
        if (why := never(MIG_DEVICES, snapshot, request)) is not None:
            if why.usable >= request.count:
                raise InvalidValueError(_too_small(MIG_DEVICES, request, why))
            of = "" if mig == ANY else f" of profile {mig}"
            raise InvalidValueError(
                f"{counted(request.count, 'MIG device')} asked for, but there "
                f"{'is' if why.usable == 1 else 'are'} {why.usable}{of} to choose from"
            )
        return request

    def _named(self, field: str) -> str:
        return named(field, by_pick=self.by_pick)

    def _said(self, field: str, value: object) -> str:
        return said(field, value, by_pick=self.by_pick)


def _too_small(kind: Kind, request: Request, why: Never) -> str:
    """`1 idle GPU with 100.0GiB free asked for, but no GPU to choose from has 100.0GiB of
    memory in all (the largest: 79.6GiB)`: a request for more memory than any device has."""
    size = format_size(why.needed_bytes)
    if why.large_enough:
        have = "has" if why.large_enough == 1 else "have"
        which = f"only {counted(why.large_enough, kind.noun)} to choose from {have}"
    else:
        which = f"no {kind.noun} to choose from has"
    largest = (
        "" if why.largest_bytes is None else f" (the largest: {format_size(why.largest_bytes)})"
    )
    return f"{describe_wish(request)} asked for, but {which} {size} of memory in all{largest}"
