"""`gpuwatch.select()` and `gpuwatch.device()`: GPUs for a script, chosen before CUDA starts.

This module is what `import gpuwatch; gpuwatch.select()` loads first, so it
stays light: the selection engine (`gpuwatch.selector`) is imported only once
there is a GPU to select. On a machine without the NVIDIA library,
`select(fallback="cpu")` answers without loading it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from gpuwatch.backends import open_backend
from gpuwatch.cudastate import cuda_initialized
from gpuwatch.errors import (
    AlreadySelectedError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    InvalidValueError,
    NoGpuError,
)
from gpuwatch.units import parse_duration, parse_size

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from gpuwatch.leases import HeldLease
    from gpuwatch.models import GpuSample

STRATEGIES = ("most-free", "least-util", "pack")
FORMATS = ("uuid", "index")


class Selection:
    """The GPUs chosen for this process, leased to it until it exits or calls `release()`.

    `gpus` are best first. `environment` holds what was set in `os.environ`
    (CUDA_VISIBLE_DEVICES, and CUDA_DEVICE_ORDER for the index format). Both
    are empty when `select(fallback="cpu")` found no GPU.
    """

    __slots__ = ("environment", "gpus", "leases")

    def __init__(
        self,
        gpus: tuple[GpuSample, ...] = (),
        environment: dict[str, str] | None = None,
        leases: tuple[HeldLease, ...] = (),
    ) -> None:
        self.gpus = gpus
        self.environment = environment or {}
        self.leases = leases

    def __repr__(self) -> str:
        return f"Selection(indices={self.indices}, environment={self.environment})"

    @property
    def indices(self) -> list[int]:
        """NVML (nvidia-smi) indices, best GPU first."""
        return [gpu.index for gpu in self.gpus]

    @property
    def uuids(self) -> list[str]:
        return [str(gpu.uuid) for gpu in self.gpus]

    def __len__(self) -> int:
        return len(self.gpus)

    def release(self) -> None:
        """Gives the GPUs back to other jobs (this process may still be using them)."""
        for lease in self.leases:
            lease.release()
        if _this_process.selection is self:
            _this_process.selection = None


class _ProcessState:
    """What `select()` chose for this process: one selection at a time."""

    selection: Selection | None = None


_this_process = _ProcessState()


def select(
    n: int = 1,
    *,
    min_free: int | str | None = None,
    max_util: float | None = None,
    mem: int | str | None = None,
    strategy: str = "most-free",
    exclude: Iterable[int | str] = (),
    wait: bool = False,
    timeout: float | str | None = None,
    fallback: str = "error",
    format: str = "uuid",
    backend: str | None = None,
    sim: str | int | None = None,
) -> Selection:
    """Chooses `n` GPUs for this process and makes CUDA see only them.

    Call it before anything touches CUDA: it sets CUDA_VISIBLE_DEVICES in
    `os.environ`, and leases the GPUs to this process until it exits, so jobs
    started alongside are given others. An existing CUDA_VISIBLE_DEVICES
    (from Slurm, Kubernetes or you) limits the choice; it is never widened.

    Sizes take bytes or strings (`"8GiB"`, `"500MB"`); `timeout` seconds or
    a duration (`"10m"`). `mem` declares what the job will use, making the
    lease shared: other jobs may join while their declarations fit. `strategy`
    is `most-free`, `least-util` or `pack`. With `wait`, blocks in line until
    enough GPUs qualify. `fallback="cpu"` returns an empty selection on a
    machine without an NVIDIA driver or GPU instead of raising.

    >>> import gpuwatch
    >>> selection = gpuwatch.select(2, min_free="8GiB", sim=4)  # sim: a simulated node
    >>> selection.indices
    [3, 2]
    >>> os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(selection.uuids)
    True
    >>> selection.release()
    """
    if (earlier := _this_process.selection) is not None:
        raise AlreadySelectedError(
            f"select() already chose GPUs {earlier.indices} for this process; "
            "call .release() on that selection first"
        )
    if (who := cuda_initialized()) is not None:
        raise CudaAlreadyInitializedError(
            f"{who} in this process, so CUDA_VISIBLE_DEVICES can no longer take effect; "
            "call gpuwatch.select() before any CUDA call (torch.cuda.is_available() is one)"
        )
    _one_of(("error", "cpu"), fallback, "fallback")
    wishes = {
        "count": _count(n),
        "min_free_bytes": _bytes(min_free, "min_free"),
        "max_util_pct": _percent(max_util),
        "mem_bytes": _bytes(mem, "mem"),
        "exclude": tuple(str(entry) for entry in exclude),
    }
    chosen_strategy = _one_of(STRATEGIES, strategy, "strategy")
    chosen_format = _one_of(FORMATS, format, "format")
    timeout_s = _seconds(timeout)
    try:
        source = open_backend(backend, None if sim is None else str(sim))
    except (DriverNotFoundError, NoGpuError):
        if fallback != "cpu":
            raise
        _this_process.selection = Selection()
        return _this_process.selection
    # There are GPUs: now load the engine.
    from gpuwatch.leases import LeaseDir
    from gpuwatch.policy import Strategy
    from gpuwatch.selector import Wanted, acquire
    from gpuwatch.visible import Format, child_environment

    wanted = Wanted.from_environment(strategy=Strategy(chosen_strategy), **wishes)
    with source:
        gpus, held = acquire(
            source,
            wanted,
            lease_dir=LeaseDir(),
            command=_own_command(),
            wait=wait,
            timeout_s=timeout_s,
        )
    environment = child_environment(gpus, Format(chosen_format), {})
    os.environ.update(environment)
    _this_process.selection = Selection(gpus, environment, tuple(held))
    return _this_process.selection


def device() -> Any:
    """The `torch.device` to compute on: `cuda:0` of the selection, else `cpu`.

    Selects GPUs first (`select(fallback="cpu")`) if this process has not. CPU
    is also the answer when torch itself cannot use CUDA (a CPU build).
    """
    import torch

    selection = _this_process.selection
    if selection is None:
        selection = select(fallback="cpu")
    if selection.gpus and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _own_command() -> str:
    return " ".join([os.path.basename(sys.executable), *sys.argv]).strip() or "python"


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidValueError(f"n={n!r}: ask for at least 1 GPU")
    return n


def _bytes(value: int | str | None, name: str) -> int | None:
    if value is None or isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except InvalidValueError as error:
        raise InvalidValueError(f"{name}: {error}") from None


def _percent(value: float | None) -> float | None:
    if value is not None and not 0 <= value <= 100:
        raise InvalidValueError(f"max_util={value!r}: give a percentage from 0 to 100")
    return value


def _seconds(value: float | str | None) -> float | None:
    return parse_duration(value) if isinstance(value, str) else value


def _one_of(choices: tuple[str, ...], value: str, name: str) -> str:
    if value not in choices:
        raise InvalidValueError(f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value
