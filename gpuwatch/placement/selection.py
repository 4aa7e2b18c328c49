"""`gpuwatch.select()` and `gpuwatch.device()`: GPUs for a script, chosen before CUDA starts.

On a machine without the NVIDIA library, `select(fallback="cpu")` answers without
loading it (`open_backend` imports the NVML bindings only to open them).
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections.abc import Iterable
from typing import Any

from gpuwatch.backends import open_backend
from gpuwatch.choices import WISHES, Format, check_one_mig_device, exclude_entries, one_of
from gpuwatch.errors import (
    AlreadySelectedError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    InvalidValueError,
    NoGpuError,
)
from gpuwatch.leases.directory import HELD_VARIABLE, HeldLease, LeaseDir
from gpuwatch.models import Device, GpuSample, MigDevice
from gpuwatch.placement.acquire import acquire, passed_down, simulated_daemon_note
from gpuwatch.placement.cudastate import cuda_initialized
from gpuwatch.placement.visible import ORDER_VARIABLE, VARIABLE, child_environment, visible_entries
from gpuwatch.placement.wanted import Wanted
from gpuwatch.placement.wanted import wanted as wanted_from
from gpuwatch.request import checked, checked_request
from gpuwatch.units import parse_duration


class Selection:
    """The GPUs chosen for this process, leased to it until it exits or calls `release()`.

    `gpus` are best first; with `select(mig=...)`, `mig_devices` holds the MIG
    device instead. `environment` holds what was set in `os.environ`
    (CUDA_VISIBLE_DEVICES, and CUDA_DEVICE_ORDER for the index format). All
    are empty when `select(fallback="cpu")` found no GPU.
    """

    __slots__ = ("_asked", "_previous", "environment", "gpus", "leases", "mig_devices")

    def __init__(
        self,
        gpus: tuple[Device, ...] = (),
        environment: dict[str, str] | None = None,
        leases: tuple[HeldLease, ...] = (),
        previous: dict[str, str | None] | None = None,
        asked: dict[str, Any] | None = None,
    ) -> None:
        self.gpus: tuple[GpuSample, ...] = tuple(g for g in gpus if isinstance(g, GpuSample))
        self.mig_devices: tuple[MigDevice, ...] = tuple(
            g for g in gpus if not isinstance(g, GpuSample)
        )
        self.environment = environment or {}
        self.leases = leases
        self._previous = previous or {}
        self._asked = asked or {}

    def __repr__(self) -> str:
        return f"Selection(indices={self.indices}, environment={self.environment})"

    @property
    def indices(self) -> list[int]:
        """NVML (nvidia-smi) indices, best GPU first; for a MIG device, its GPU's."""
        return [gpu.index for gpu in self.gpus] + [mig.gpu_index for mig in self.mig_devices]

    @property
    def uuids(self) -> list[str]:
        """`GPU-...` UUIDs, or the MIG device's `MIG-...` UUID."""
        return [str(gpu.uuid) for gpu in self.gpus] + [str(m.uuid) for m in self.mig_devices]

    def __len__(self) -> int:
        return len(self.gpus) + len(self.mig_devices)

    def release(self) -> None:
        """Gives the GPUs back to other jobs, and CUDA_VISIBLE_DEVICES its earlier value.

        A process that already runs CUDA keeps using the GPUs it has: releasing
        only lets other jobs be given them.
        """
        for lease in self.leases:
            lease.release()
        for name, value in self._previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if _this_process.selection is self:
            _this_process.selection = None


class _ProcessState:
    """What `select()` chose for this process: one selection at a time."""

    selection: Selection | None = None


_this_process = _ProcessState()

# `select()` arguments as the user names them, keyed by how they are kept once checked.
_ARGUMENT_NAMES = {
    **{name: argument for name, argument, _ in WISHES},
    **{name: name for name in ("fallback", "format", "backend", "sim")},
}


def select(
    n: int = 1,
    *,
    min_free: int | str | None = None,
    max_util: float | None = None,
    mem: int | str | None = None,
    max_used: int | str | None = None,
    allow_busy: bool = False,
    allow_unknown_holders: bool = False,
    strategy: str = "most-free",
    exclude: str | int | Iterable[int | str] = (),
    wait: bool = False,
    timeout: float | str | None = None,
    fallback: str = "error",
    format: str = "uuid",
    backend: str | None = None,
    sim: str | int | None = None,
    mig: str | None = None,
) -> Selection:
    """Chooses `n` GPUs for this process and makes CUDA see only them.

    Call it before anything touches CUDA: it sets CUDA_VISIBLE_DEVICES in
    `os.environ`, and leases the GPUs to this process until it exits, so jobs
    started alongside are given others. An existing CUDA_VISIBLE_DEVICES
    (from Slurm, Kubernetes or you) limits the choice; it is never widened,
    and one that hides every GPU (`-1`) means no GPU. Inside a Slurm job or
    step, only the GPUs Slurm gave it (`SLURM_STEP_GPUS`, found through
    gres.conf) are chosen from, even where Slurm's own CUDA_VISIBLE_DEVICES
    names others (a `RuntimeWarning` says so); `GPUWATCH_IGNORE_SLURM=1`
    turns that off.

    Only GPUs nobody uses qualify: no other job's compute process, no
    graphics process over 256MiB, at most `max_used` memory in use (default
    1GiB) and at most `max_util` percent busy (default 5), now and, with the
    daemon running, over the last minute. `allow_busy=True` takes GPUs in use
    as if free, ranked by free memory alone. A GPU a Slurm job or a Kubernetes
    pod holds is never chosen, nor, where the node's scheduler is down, slow or
    malformed, one whose holders nobody can tell: `allow_unknown_holders=True`
    takes those anyway. `mem` declares what the job
    will use, making the lease shared: other jobs may join while their
    declarations fit, on GPUs in use too.

    Sizes take bytes (an int) or strings with a unit (`"8GiB"`, `"500MB"`);
    `timeout` seconds or a duration (`"10m"`). `exclude` takes indices or
    UUIDs, as a list or comma-separated (`"1,2"`). `strategy` is
    `most-free`, `least-util` or `pack`. With `wait`, blocks in line until
    enough GPUs qualify. `fallback="cpu"` returns an empty selection on a
    machine without an NVIDIA driver or GPU instead of raising.

    `mig` (a profile such as `"1g.10gb"`, or `"any"`) selects a free MIG device
    of a MIG-enabled GPU instead of a whole GPU; CUDA shows a process one MIG
    device, so `n` must then be 1. A CUDA_VISIBLE_DEVICES of `MIG-` UUIDs only
    implies `mig="any"`.

    A process holds one selection at a time. Calling `select()` again (a
    notebook cell run twice) returns the same selection when the arguments
    agree (`wait` and `timeout` aside); when they differ it raises
    `AlreadySelectedError`, naming them: `release()` the first one to choose
    anew.

    >>> import gpuwatch
    >>> selection = gpuwatch.select(min_free="8GiB", sim=4)  # sim: a simulated node
    >>> selection.indices  # the one GPU of four that nobody uses
    [3]
    >>> os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(selection.uuids)
    True
    >>> gpuwatch.select(min_free="8GiB", sim=4) is selection  # run again: the same GPU
    True
    >>> selection.release()
    """
    request = checked_request(
        n=n,
        min_free=min_free,
        max_util=max_util,
        mem=mem,
        max_used=max_used,
        allow_busy=allow_busy,
        allow_unknown_holders=allow_unknown_holders,
        strategy=strategy,
        mig=mig,
    )
    excluded: tuple[str, ...] = checked("exclude", exclude_entries, exclude)
    # How this call was made, argument by argument: a second call is compared with it.
    asked = {
        **{name: getattr(request, name) for name, _, _ in WISHES if name != "exclude"},
        "strategy": str(request.strategy),  # as the caller wrote it
        "exclude": excluded,
        "fallback": _checked_fallback(fallback),
        "format": str(one_of(Format, format, "format")),
        "backend": backend,
        "sim": None if sim is None else str(sim),
    }
    timeout_s = parse_duration(timeout) if isinstance(timeout, str) else timeout
    if (earlier := _this_process.selection) is not None:
        return _same_as(earlier, asked)
    if (who := cuda_initialized()) is not None:
        raise CudaAlreadyInitializedError(
            f"{who} in this process, so CUDA_VISIBLE_DEVICES can no longer take effect; "
            "call gpuwatch.select() before any CUDA call (torch.cuda.is_available() is one)"
        )
    try:
        _check_something_visible()
        return _select(
            asked,
            wanted_from(request, excluded, environ=os.environ, by_pick=False),
            wait,
            timeout_s,
        )
    except (DriverNotFoundError, NoGpuError):
        if fallback != "cpu":
            raise
        _this_process.selection = Selection(asked=asked)
        return _this_process.selection


def _same_as(earlier: Selection, asked: dict[str, Any]) -> Selection:
    """The earlier selection, when asked for again with the same arguments."""
    differing = [key for key in _ARGUMENT_NAMES if earlier._asked.get(key) != asked[key]]
    if not differing:
        return earlier
    now = ", ".join(f"{_ARGUMENT_NAMES[key]}={asked[key]!r}" for key in differing)
    before = ", ".join(f"{_ARGUMENT_NAMES[key]}={earlier._asked.get(key)!r}" for key in differing)
    raise AlreadySelectedError(
        f"select({now}) differs from the select({before}) that chose GPUs {earlier.indices} "
        "for this process; call .release() on that selection first to choose again"
    )


def _check_something_visible() -> None:
    """Raises `NoGpuError` when CUDA_VISIBLE_DEVICES hides every GPU, before any is read."""
    if (value := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        visible_entries(value)


def _select(
    asked: dict[str, Any], wanted: Wanted, wait: bool, timeout_s: float | None
) -> Selection:
    source = open_backend(asked["backend"], asked["sim"])
    if wanted.wants_mig:
        check_one_mig_device(wanted.asked.count, "process")
    with source:
        if (note := simulated_daemon_note(source)) is not None:
            _warn(note)
        gpus, held = acquire(
            source,
            wanted,
            lease_dir=LeaseDir.for_job(say=_warn, simulation=source.simulation),
            command=_own_command(),
            wait=wait,
            timeout_s=timeout_s,
            on_note=_warn,
        )
    environment = passed_down(held, child_environment(gpus, Format(asked["format"]), {}))
    previous = {name: os.environ.get(name) for name in (VARIABLE, ORDER_VARIABLE, HELD_VARIABLE)}
    os.environ.update(environment)
    _this_process.selection = Selection(gpus, environment, tuple(held), previous, asked)
    return _this_process.selection


def device() -> Any:
    """The `torch.device` to compute on: `cuda:0` of the selection, else `cpu`.

    Selects GPUs first (`select(fallback="cpu")`) if this process has not.
    When torch itself cannot use CUDA (a CPU build on a GPU machine), the
    answer is `cpu` too: a `RuntimeWarning` says why, once, and the GPUs
    leased to this process are given back for other jobs.
    """
    import torch  # here: `import gpuwatch` and select() must not import torch

    selection = _this_process.selection
    if selection is None:
        selection = select(fallback="cpu")
    if not len(selection):
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    _give_back_unusable(selection, torch.version.cuda)
    return torch.device("cpu")


def _give_back_unusable(selection: Selection, torch_cuda_version: str | None) -> None:
    why = (
        "this torch is a CPU-only build"
        if torch_cuda_version is None
        else "torch cannot use CUDA here (torch.cuda.is_available() is False)"
    )
    warnings.warn(
        f"gpuwatch.device() is cpu: {why}; giving back GPUs {selection.indices}, "
        "which select() leased to this process, for other jobs",
        RuntimeWarning,
        stacklevel=3,
    )
    asked = selection._asked
    selection.release()
    # From now on this process holds no GPU: the same question gets the CPU, silently.
    _this_process.selection = Selection(asked=asked)


def _warn(message: str) -> None:
    """Who could tamper with the lease directory, that no lease is held, or that Slurm's
    CUDA_VISIBLE_DEVICES names other GPUs than the step's: said once."""
    warnings.warn(f"gpuwatch: {message}", RuntimeWarning, stacklevel=4)


def _own_command() -> str:
    return shlex.join([os.path.basename(sys.executable), *sys.argv]).strip() or "python"


def _checked_fallback(fallback: str) -> str:
    if fallback not in ("error", "cpu"):
        raise InvalidValueError(f"fallback={fallback!r}: choose one of error, cpu")
    return fallback
