"""Selecting GPUs for a job: `select()` for scripts, and the engine under `gpuwatch pick`.

The steps, under the lease directory's lock: read the leases in force and the
jobs waiting ahead, sample the GPUs, let `policy.choose()` decide, and claim
what it chose. Waiting repeats this until enough GPUs qualify.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.backends import Backend, SampleScope, open_backend
from gpuwatch.cudastate import cuda_initialized
from gpuwatch.errors import (
    AlreadySelectedError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    InvalidValueError,
    NoGpuError,
    NotEnoughGpusError,
    WaitTimeoutError,
)
from gpuwatch.hostinfo import lineage
from gpuwatch.leases import HeldFile, HeldLease, LeaseDir
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.policy import Choice, Request, Strategy, choose
from gpuwatch.units import format_size, parse_duration, parse_size
from gpuwatch.visible import (
    ORDER_VARIABLE,
    VARIABLE,
    Format,
    child_environment,
    parse_visible_devices,
    resolve,
)

POLL_S = 0.5
OnWait = Callable[[Choice, float], None]


@dataclass(frozen=True, slots=True)
class Wanted:
    """A job's wishes as written, before GPU names are resolved against the machine."""

    count: int = 1
    min_free_bytes: int | None = None
    max_util_pct: float | None = None
    mem_bytes: int | None = None
    strategy: Strategy = Strategy.MOST_FREE
    exclude: tuple[str, ...] = ()
    visible: tuple[str, ...] | None = None
    """The CUDA_VISIBLE_DEVICES entries in force; `None` when it is unset."""
    device_order: str | None = None

    @classmethod
    def from_environment(cls, **wishes: Any) -> Wanted:
        """Wishes plus the CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER of this process."""
        value = os.environ.get(VARIABLE)
        visible = None if value is None else parse_visible_devices(value)
        return cls(visible=visible, device_order=os.environ.get(ORDER_VARIABLE), **wishes)

    @property
    def needs_names(self) -> bool:
        """Index entries in CUDA's default order can be trusted only on a node of one model."""
        return self.device_order != "PCI_BUS_ID" and any(e.isdigit() for e in self.visible or ())

    def resolve(self, snapshot: Snapshot) -> Request:
        """The request in NVML indices; refuses one that no amount of waiting could meet."""
        gpus = snapshot.gpus
        allowed = (
            None
            if self.visible is None
            else resolve(self.visible, gpus, device_order=self.device_order)
        )
        excluded = resolve(self.exclude, gpus, device_order="PCI_BUS_ID", what="--exclude")
        usable = (allowed if allowed is not None else {gpu.index for gpu in gpus}) - excluded
        if self.count > len(usable):
            where = "this machine has" if allowed is None else f"{VARIABLE} allows"
            left = " after --exclude" if excluded else ""
            raise InvalidValueError(f"{self.count} GPUs asked for, but {where} {len(usable)}{left}")
        return Request(
            count=self.count,
            min_free_bytes=self.min_free_bytes,
            max_util_pct=self.max_util_pct,
            mem_bytes=self.mem_bytes,
            strategy=self.strategy,
            allowed=allowed,
            excluded=excluded,
        )


def acquire(
    backend: Backend,
    wanted: Wanted,
    *,
    lease_dir: LeaseDir,
    command: str,
    hold: bool = True,
    wait: bool = False,
    timeout_s: float | None = None,
    on_wait: OnWait | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[tuple[GpuSample, ...], list[HeldLease]]:
    """Chooses GPUs and, with `hold`, leases them to this process; waits in line with `wait`.

    Raises `NotEnoughGpusError` (or `WaitTimeoutError`) with a reason per GPU.
    """
    started = clock()
    request: Request | None = None
    ticket: HeldFile | None = None
    # GPUs leased to this process or one it runs under are its own to use: a script that
    # selected GPUs may start workers that call select() again, and nested picks are fine.
    family = lineage()
    try:
        while True:
            with lease_dir.locked():
                leases = [lease for lease in lease_dir.leases() if lease.pid not in family]
                shared = any(not lease.exclusive for lease in leases)
                # Shared leases are weighed against their holders' use, which needs the processes.
                full = shared or wanted.needs_names
                snapshot = backend.sample(SampleScope.FULL if full else SampleScope.SELECTION)
                request = request or wanted.resolve(snapshot)
                ahead = lease_dir.waiting_before(ticket)
                choice = choose(
                    snapshot, request, leases=leases, waiting_ahead=ahead, seed=os.getpid()
                )
                if choice.satisfied:
                    held = (
                        [
                            lease_dir.claim(gpu, mem_bytes=request.mem_bytes, command=command)
                            for gpu in choice.chosen
                        ]
                        if hold
                        else []
                    )
                    return choice.chosen, held
                if wait and ticket is None:
                    ticket = lease_dir.enqueue(request, command)
            waited_s = clock() - started
            if not wait:
                raise NotEnoughGpusError(_shortfall(request, choice), choice.reasons)
            if timeout_s is not None and waited_s >= timeout_s:
                raise WaitTimeoutError(
                    f"gave up after waiting {waited_s:.0f}s: {_shortfall(request, choice)}",
                    choice.reasons,
                )
            if on_wait is not None:
                on_wait(choice, waited_s)
            remaining = POLL_S if timeout_s is None else timeout_s - waited_s
            sleep(max(0.0, min(POLL_S, remaining)))
    finally:
        if ticket is not None:
            ticket.release()


def describe_wish(request: Request) -> str:
    """`2 GPUs with 8.0GiB free, at most 50% busy` for messages."""
    parts = [f"{request.count} GPU{'s' if request.count > 1 else ''}"]
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    if needed:
        parts.append(f"with {format_size(needed)} free")
    if request.max_util_pct is not None:
        parts.append(f"at most {request.max_util_pct:g}% busy")
    return " ".join(parts)


def _shortfall(request: Request, choice: Choice) -> str:
    qualify = "qualifies" if choice.qualifying == 1 else "qualify"
    return f"{describe_wish(request)} wanted, {choice.qualifying} {qualify}"


@dataclass(frozen=True)
class Selection:
    """The GPUs chosen for this process, leased to it until it exits or calls `release()`.

    `environment` holds what was set in `os.environ` (CUDA_VISIBLE_DEVICES,
    and CUDA_DEVICE_ORDER for index format). Empty when `select(fallback="cpu")`
    found no GPU.
    """

    gpus: tuple[GpuSample, ...]
    environment: dict[str, str]
    leases: tuple[HeldLease, ...] = field(default=(), repr=False)

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
    if fallback not in ("error", "cpu"):
        raise InvalidValueError(f"fallback={fallback!r}: choose 'error' or 'cpu'")
    wanted = Wanted.from_environment(
        count=_count(n),
        min_free_bytes=_bytes(min_free, "min_free"),
        max_util_pct=_percent(max_util),
        mem_bytes=_bytes(mem, "mem"),
        strategy=_choice(Strategy, strategy, "strategy"),
        exclude=tuple(str(entry) for entry in exclude),
    )
    fmt = _choice(Format, format, "format")
    try:
        source = open_backend(backend, None if sim is None else str(sim))
    except (DriverNotFoundError, NoGpuError):
        if fallback != "cpu":
            raise
        _this_process.selection = Selection((), {})
        return _this_process.selection
    with source:
        gpus, held = acquire(
            source,
            wanted,
            lease_dir=LeaseDir(),
            command=_own_command(),
            wait=wait,
            timeout_s=_seconds(timeout),
        )
    environment = child_environment(gpus, fmt, {})
    os.environ.update(environment)
    _this_process.selection = Selection(gpus, environment, tuple(held))
    return _this_process.selection


def device() -> Any:
    """The `torch.device` to compute on: `cuda:0` of the selection, else `cpu`.

    Selects GPUs first (`select(fallback="cpu")`) if this process has not. CPU
    is also the answer when torch itself cannot use CUDA (a CPU build).
    """
    import torch

    selection = _this_process.selection or select(fallback="cpu")
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


def _choice(kind: Any, value: str, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise InvalidValueError(f"{name}={value!r}: choose one of {choices}") from None
