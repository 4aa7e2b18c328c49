"""The GPUs a Slurm job or step was given, for `gpuwatch pick` and `select()` run inside one.

Slurm names a step's GPUs in `SLURM_STEP_GPUS` (a batch script's: `SLURM_JOB_GPUS`) as
GRES indices: places in gres.conf's `File=` list for this node, neither NVML's indices nor
CUDA's. gres.conf turns them into device files, and a device file's minor number is one NVML
reports too, so the step's GPUs are known whatever order gres.conf lists the files in.

Slurm's own CUDA_VISIBLE_DEVICES is indices. Under a device cgroup they count the step's GPUs
alone and agree; without one, on a node whose gres.conf is not in CUDA's order, they name
other GPUs: another job's. So inside a step the step's GPUs are the ones to choose from,
index entries of CUDA_VISIBLE_DEVICES that name others are passed over (with one line saying
so), and the GPUs chosen are written by UUID. `GPUWATCH_IGNORE_SLURM=1` turns this off.

MIG devices are not matched here: gres.conf names them by `nvidia-caps` files, whose minor
numbers are no GPU's; CUDA_VISIBLE_DEVICES of `MIG-` UUIDs decides, as outside Slurm.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwatch.errors import NoGpuError, VisibleDevicesError
from gpuwatch.jobs.gres import default_gres_conf, gres_gpu_files, minor_number_of, parse_index_list
from gpuwatch.models import GpuSample
from gpuwatch.placement.visible import VARIABLE, resolve

IGNORE_VARIABLE = "GPUWATCH_IGNORE_SLURM"
GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
"""Where Slurm names the GPUs it gave: the step's first, else the job's (a batch script)."""
MAX_GRES_CONF_BYTES = 1 << 20
_OFF = "set GPUWATCH_IGNORE_SLURM=1 to choose as outside Slurm"


@dataclass(frozen=True, slots=True)
class SlurmStep:
    """The GPUs Slurm gave this job or step, by the device files gres.conf names."""

    variable: str
    """`SLURM_STEP_GPUS` or `SLURM_JOB_GPUS`: the variable that named them."""
    value: str
    files: tuple[str, ...]
    """Their device files, in the variable's order."""
    minors: tuple[int, ...]
    """The device files' minor numbers, as `files`."""

    @property
    def said(self) -> str:
        """`SLURM_STEP_GPUS=0,2`, for messages."""
        return f"{self.variable}={self.value}"


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The step this process runs in, `None` outside Slurm, in a job without GPUs, or with
    `GPUWATCH_IGNORE_SLURM=1`.

    Raises `VisibleDevicesError` when the GPUs cannot be told: a garbled variable, a
    gres.conf that cannot be read or lists fewer GPU files than the indices need.
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
    files = _step_files(environ, f"{variable}={value}", indices)
    return SlurmStep(variable, value, files, _minors(files, f"{variable}={value}"))


def _step_files(environ: Mapping[str, str], said: str, indices: Sequence[int]) -> tuple[str, ...]:
    path = default_gres_conf(environ)
    node = environ.get("SLURMD_NODENAME") or _host_name()
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_GRES_CONF_BYTES).decode(errors="replace")
    except OSError as error:
        raise VisibleDevicesError(
            f"{said}: cannot read {path} ({error.strerror}), which says which GPUs those "
            f"are; point SLURM_CONF at the slurm.conf beside it, or {_OFF}"
        ) from None
    files = gres_gpu_files(text, node)
    if beyond := [index for index in indices if index >= len(files)]:
        listed = f"only {len(files)} GPU File=" if files else "no GPU File="
        raise VisibleDevicesError(
            f"{said}: {path} lists {listed} for node {node}, so GRES index {beyond[0]} names "
            f"no GPU; {_OFF}"
        )
    return tuple(files[index] for index in indices)


def _host_name() -> str:
    """The short host name: Slurm's name for the node where slurmd did not say
    (`SLURMD_NODENAME`, which Slurm sets in every job)."""
    return socket.gethostname().split(".")[0]


def _minors(files: Sequence[str], said: str) -> tuple[int, ...]:
    minors = []
    for path in files:
        minor = minor_number_of(path)
        if minor is None:
            raise VisibleDevicesError(
                f"{said}: {path} is no GPU device file (nor named nvidiaN); {_OFF}"
            )
        minors.append(minor)
    return tuple(minors)


def step_indices(step: SlurmStep, gpus: Sequence[GpuSample]) -> frozenset[int]:
    """The NVML indices of the step's GPUs among `gpus`, found by minor number.

    Raises `VisibleDevicesError` when one of them is not among `gpus`.
    """
    by_minor = {gpu.minor_number: gpu.index for gpu in gpus if gpu.minor_number is not None}
    for path, minor in zip(step.files, step.minors, strict=True):
        if minor not in by_minor:
            known = "" if by_minor else " (the driver reports no minor numbers)"
            raise VisibleDevicesError(
                f"{step.said}: {path} is minor number {minor}, but no GPU here has it{known}; "
                f"{_OFF}"
            )
    return frozenset(by_minor[minor] for minor in step.minors)


def allowed_in_step(
    step: SlurmStep,
    gpus: Sequence[GpuSample],
    visible: Sequence[str] | None,
    *,
    device_order: str | None,
) -> tuple[frozenset[int], str | None]:
    """The NVML indices a job in `step` may have, and a note when CUDA_VISIBLE_DEVICES
    (`visible`) names GPUs other than the step's.

    CUDA_VISIBLE_DEVICES narrows the step's GPUs where it names some of them (a UUID, a
    choice made earlier in the job); index entries that name other GPUs, or none here, are
    Slurm's numbering gone astray and are passed over, which the note says.
    """
    ours = step_indices(step, gpus)
    if visible is None:
        return ours, None
    uuids = [entry for entry in visible if not entry.isdigit()]
    indices = [entry for entry in visible if entry.isdigit()]
    named = resolve(uuids, gpus, device_order=device_order) if uuids else None
    note = None
    if indices:
        by_index, note = _indices_in_step(step, ours, indices, gpus, device_order)
        if by_index is not None:
            named = by_index | (named or frozenset())
    if named is None:
        return ours, note
    if not ours & named:
        raise NoGpuError(
            f"{VARIABLE}={','.join(visible)} names none of this step's GPUs ({step.said}); "
            f"unset it, or {_OFF}"
        )
    return ours & named, note


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
    theirs = (
        f"this step's {_described(ours, gpus)}, which {step.said} names ({', '.join(step.files)})"
    )
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
