"""The GPUs a Slurm job or step was given, for `gpuwatch pick` and `select()` run inside one.

Slurm names a step's GPUs in `SLURM_STEP_GPUS` (a batch script's: `SLURM_JOB_GPUS`) as
GRES indices: places in slurmd's list of the node's GPUs (`gpuwatch.jobs.gres_conf` builds
it as slurmd does), neither NVML's indices nor CUDA's. A GRES index is a device file, and a
device file's minor number is one NVML reports too, so the step's GPUs are known whatever
order gres.conf lists the files in.

Where the step has a device cgroup (Slurm's ConstrainDevices), what it can open decides: a
GPU device file it cannot open (EPERM) is not its own, whatever gres.conf says. When the
two disagree (gres.conf edited after slurmd started, an Include slurmd read otherwise), the
GPUs the step can open are chosen from, and one line says so.

Slurm's own CUDA_VISIBLE_DEVICES is indices. Under a device cgroup they count the step's GPUs
alone and agree; without one, on a node whose gres.conf is not in CUDA's order, they name
other GPUs: another job's. So inside a step the step's GPUs are the ones to choose from,
index entries of CUDA_VISIBLE_DEVICES that name others are passed over (with one line saying
so), and the GPUs chosen are written by UUID. `GPUWATCH_IGNORE_SLURM=1` turns this off.

MIG devices are not matched here: gres.conf names them by `nvidia-caps` files, whose minor
numbers are no GPU's; CUDA_VISIBLE_DEVICES of `MIG-` UUIDs decides, as outside Slurm.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from gpuwatch.errors import NoGpuError, VisibleDevicesError
from gpuwatch.jobs.gres import NVIDIA_MAJOR, default_gres_conf, minor_number_of, parse_index_list
from gpuwatch.jobs.gres_conf import GpuLayout, GresOrderUnknown, detected_gpus, gpu_layout
from gpuwatch.jobs.slurm import slurm_node_name
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.models import GpuSample
from gpuwatch.placement.visible import VARIABLE, resolve

IGNORE_VARIABLE = "GPUWATCH_IGNORE_SLURM"
GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
"""Where Slurm names the GPUs it gave: the step's first, else the job's (a batch script)."""
DEVICES = Path("/dev")
_OFF = "set GPUWATCH_IGNORE_SLURM=1 to choose as outside Slurm"
_GPU_DEVICE = re.compile(r"^nvidia(\d+)$")
Openable = Callable[[], frozenset[int] | None]
"""The minor numbers of the GPU device files this process can open, or `None` where it
can open them all (no device cgroup)."""


class SlurmStep(msgspec.Struct, frozen=True):
    """The GPUs Slurm gave this job or step, by GRES index, and the node's list of GPUs
    (`None` where it cannot be told: `unknown_why` says why)."""

    variable: str
    """`SLURM_STEP_GPUS` or `SLURM_JOB_GPUS`: the variable that named them."""
    value: str
    indices: tuple[int, ...]
    layout: GpuLayout | None
    unknown_why: str = ""

    @property
    def said(self) -> str:
        """`SLURM_STEP_GPUS=0,2`, for messages."""
        return f"{self.variable}={self.value}"

    @property
    def files(self) -> tuple[str, ...]:
        """The step's device files, in the variable's order, where gres.conf alone tells
        them (not under `AutoDetect=nvml`: see `files_among`)."""
        return self.files_among(None)

    @property
    def minors(self) -> tuple[int, ...]:
        """The device files' minor numbers, as `files`."""
        return tuple(_minor(path, self.said) for path in self.files)

    def allowed(
        self, gpus: Sequence[GpuSample], visible: Sequence[str] | None, *, device_order: str | None
    ) -> tuple[frozenset[int], str | None]:
        """The NVML indices a job in this step may have (`allowed_in_step`)."""
        return allowed_in_step(self, gpus, visible, device_order=device_order)

    def given(self, gpus: Sequence[GpuSample]) -> frozenset[int]:
        """The NVML indices of this step's GPUs among `gpus` (`step_indices`)."""
        return step_indices(self, gpus)

    def files_among(self, gpus: Sequence[GpuSample] | None) -> tuple[str, ...]:
        """The step's device files, NVML's order of `gpus` taken where slurmd's needs it;
        `VisibleDevicesError` where they cannot be told."""
        if self.layout is None:
            raise VisibleDevicesError(f"{self.said}: {self.unknown_why}; {_OFF}")
        try:
            slots = self.layout.ordered(detected_gpus(gpus) if gpus is not None else None)
        except GresOrderUnknown as error:
            raise VisibleDevicesError(f"{self.said}: {error}; {_OFF}") from None
        for index in self.indices:
            if len(slots[index].files) > 1:
                files = ",".join(slots[index].files)
                raise VisibleDevicesError(
                    f"{self.said}: GRES index {index} is a MIG device ({files}), not a whole "
                    f"GPU; {_OFF}"
                )
        return tuple(slots[index].files[0] for index in self.indices)


def slurm_step(environ: Mapping[str, str], openable: Openable | None = None) -> SlurmStep | None:
    """The step this process runs in, `None` outside Slurm, in a job without GPUs, or with
    `GPUWATCH_IGNORE_SLURM=1`.

    Raises `VisibleDevicesError` for a garbled variable, or a gres.conf that lists fewer GPUs
    than the indices need, or that cannot be read or ordered where no device cgroup tells
    the step's GPUs either (`openable`, by default `device_opens`); under one, that is kept
    as `unknown_why`, and what the step can open tells its GPUs.
    """
    if environ.get(IGNORE_VARIABLE, "").strip() not in ("", "0") or not environ.get("SLURM_JOB_ID"):
        return None
    named = next(
        ((name, environ[name].strip()) for name in GPU_VARIABLES if environ.get(name, "").strip()),
        None,
    )
    if named is None:
        return None
    variable, value = named
    indices = parse_index_list(value)
    if indices is None or len(set(indices)) != len(indices):
        raise VisibleDevicesError(f"{variable}={value!r} is not a list of GRES indices; {_OFF}")
    node = slurm_node_name(environ)
    conf = configured_slurm_conf(environ)
    path = default_gres_conf(environ)
    try:
        layout = gpu_layout(path, Path(conf) if conf is not None else None, node)
    except GresOrderUnknown as error:
        if (openable or device_opens)() is None:
            raise VisibleDevicesError(f"{variable}={value}: {error}; {_OFF}") from None
        return SlurmStep(variable, value, tuple(indices), None, str(error))
    if beyond := [index for index in indices if index >= len(layout.slots)]:
        raise VisibleDevicesError(
            f"{variable}={value}: {path} lists only {len(layout.slots)} GPU File= for node {node}, "
            f"so GRES index {beyond[0]} names no GPU; {_OFF}"
        )
    return SlurmStep(variable, value, tuple(indices), layout)


def device_opens(devices: Path = DEVICES) -> frozenset[int] | None:
    """The minor numbers of the GPU device files (/dev/nvidiaN) this process can open,
    where a device cgroup forbids some (EPERM); `None` where none is forbidden."""
    opened, forbidden = set(), False
    try:
        names = [entry.name for entry in os.scandir(devices)]
    except OSError:
        return None
    for name in names:
        match = _GPU_DEVICE.match(name)
        if match is None:
            continue
        try:
            descriptor = os.open(devices / name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as error:
            forbidden = forbidden or error.errno == errno.EPERM
            continue
        try:
            if os.major(os.fstat(descriptor).st_rdev) == NVIDIA_MAJOR:
                opened.add(int(match.group(1)))
        finally:
            os.close(descriptor)
    return frozenset(opened) if forbidden else None


def step_indices(
    step: SlurmStep, gpus: Sequence[GpuSample], openable: Openable = device_opens
) -> frozenset[int]:
    """The NVML indices of the step's GPUs among `gpus` (see `step_gpus`)."""
    return step_gpus(step, gpus, openable)[0]


def step_gpus(
    step: SlurmStep, gpus: Sequence[GpuSample], openable: Openable = device_opens
) -> tuple[frozenset[int], str | None]:
    """The NVML indices of the step's GPUs among `gpus`, found by minor number, and a note
    where what the step can open disagrees with gres.conf (the step's openable GPUs win).

    Raises `VisibleDevicesError` when they cannot be told, `NoGpuError` when the step can
    open none of `gpus`.
    """
    opened = openable()
    if opened is None:
        return _by_gres(step, gpus), None
    mine = frozenset(gpu.index for gpu in gpus if gpu.minor_number in opened)
    if not mine:
        raise NoGpuError(f"{step.said}: this step can open none of this node's GPUs")
    try:
        by_gres: frozenset[int] | str = _by_gres(step, gpus)
    except VisibleDevicesError as error:
        by_gres = str(error).split("; " + _OFF)[0]
    if by_gres == mine:
        return mine, None
    named = _described(by_gres, gpus) if isinstance(by_gres, frozenset) else by_gres
    return mine, (
        f"{step.said} names {named} by gres.conf, but this step can open only "
        f"{_described(mine, gpus)} (its device cgroup): choosing among those"
    )


def _by_gres(step: SlurmStep, gpus: Sequence[GpuSample]) -> frozenset[int]:
    by_minor = {gpu.minor_number: gpu.index for gpu in gpus if gpu.minor_number is not None}
    files = step.files_among(gpus)
    chosen = set()
    for path in files:
        minor = _minor(path, step.said)
        if minor not in by_minor:
            known = "" if by_minor else " (the driver reports no minor numbers)"
            raise VisibleDevicesError(
                f"{step.said}: {path} is minor number {minor}, but no GPU here has it{known}; "
                f"{_OFF}"
            )
        chosen.add(by_minor[minor])
    return frozenset(chosen)


def _minor(path: str, said: str) -> int:
    minor = minor_number_of(path)
    if minor is None:
        raise VisibleDevicesError(
            f"{said}: {path} is no GPU device file (nor named nvidiaN); {_OFF}"
        )
    return minor


def allowed_in_step(
    step: SlurmStep,
    gpus: Sequence[GpuSample],
    visible: Sequence[str] | None,
    *,
    device_order: str | None,
    openable: Openable = device_opens,
) -> tuple[frozenset[int], str | None]:
    """The NVML indices a job in `step` may have, and a note when CUDA_VISIBLE_DEVICES
    (`visible`) names GPUs other than the step's, or the step's device cgroup disagrees
    with gres.conf.

    CUDA_VISIBLE_DEVICES narrows the step's GPUs where it names some of them (a UUID, a
    choice made earlier in the job); index entries that name other GPUs, or none here, are
    Slurm's numbering gone astray and are passed over, which the note says.
    """
    ours, cgroup_note = step_gpus(step, gpus, openable)
    if visible is None:
        return ours, cgroup_note
    uuids = [entry for entry in visible if not entry.isdigit()]
    indices = [entry for entry in visible if entry.isdigit()]
    named = resolve(uuids, gpus, device_order=device_order) if uuids else None
    note = None
    if indices:
        by_index, note = _indices_in_step(step, ours, indices, gpus, device_order)
        if by_index is not None:
            named = by_index | (named or frozenset())
    notes = "; ".join(n for n in (cgroup_note, note) if n) or None
    if named is None:
        return ours, notes
    if not ours & named:
        raise NoGpuError(
            f"{VARIABLE}={','.join(visible)} names none of this step's GPUs ({step.said}); "
            f"unset it, or {_OFF}"
        )
    return ours & named, notes


def _indices_in_step(
    step: SlurmStep,
    ours: frozenset[int],
    indices: Sequence[str],
    gpus: Sequence[GpuSample],
    device_order: str | None,
) -> tuple[frozenset[int] | None, str | None]:
    """The GPUs index entries name when all are the step's; else `None`, and why not where
    that can be told (on a node of mixed models CUDA's order cannot: nothing is said)."""
    said = f"{VARIABLE}={','.join(indices)}"
    theirs = f"this step's {_described(ours, gpus)}, which {step.said} names"
    if step.layout is not None:
        theirs += f" ({', '.join(step.files_among(gpus))})"
    if any(int(entry) >= len(gpus) for entry in indices):
        return None, f"{said} names no GPU here, not {theirs}; choosing among the step's GPUs"
    try:
        named = resolve(indices, gpus, device_order=device_order)
    except VisibleDevicesError:
        return None, None
    if named <= ours:
        return named, None
    return None, (
        f"{said} would name {_described(named, gpus)}, not {theirs}: gres.conf is not in "
        "CUDA's order; choosing among the step's GPUs instead"
    )


def _described(indices: frozenset[int], gpus: Sequence[GpuSample]) -> str:
    """`GPU 3 (GPU-5e1a...)`, `GPUs 0 (GPU-...), 1 (GPU-...)`."""
    uuid = {gpu.index: gpu.uuid for gpu in gpus}
    each = ", ".join(f"{index} ({uuid.get(index) or 'UUID unknown'})" for index in sorted(indices))
    return f"GPU{'s' if len(indices) > 1 else ''} {each}"
