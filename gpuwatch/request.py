"""What a job asks for (`Request`) and a job waiting in line (`Waiter`): the inputs of the
placement rules, plain values with no I/O.

The strict JSON form of a request, which waiting tickets carry, lives with the other
records read from the lease directory: `gpuwatch.leases.records`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gpuwatch.choices import (
    MIG_ANY,
    Strategy,
    check_gpu_count,
    check_mig,
    check_percent,
    one_of,
)
from gpuwatch.errors import InvalidValueError
from gpuwatch.units import format_size, parse_size

IDLE_MAX_UTIL_PCT = 5.0
"""The utilization above which a GPU counts as in use, unless `--max-util` says otherwise."""
IDLE_MAX_USED_BYTES = 1 << 30
"""The memory in use (beyond the driver's reserve) above which a GPU counts as in use,
unless `--max-used` says otherwise."""


class Request(msgspec.Struct, frozen=True):
    """What a job asks for. GPU sets hold NVML indices."""

    count: int = 1
    min_free_bytes: int | None = None
    max_util_pct: float | None = None
    mem_bytes: int | None = None
    """Memory the job declares it will use: the lease is then shared. `None`: exclusive."""
    strategy: Strategy = Strategy.MOST_FREE
    allowed: frozenset[int] | None = None
    """The GPUs it may have (from CUDA_VISIBLE_DEVICES, a Slurm step); `None`: any."""
    job_gpus: frozenset[int] | None = None
    """The GPUs Slurm gave the job or step it runs in, within which `allowed` lies (to say
    why the others are not given); `None` outside Slurm."""
    excluded: frozenset[int] = frozenset()
    mig: str | None = None
    """A MIG profile (`1g.10gb`) or `any`: MIG devices are wanted, not whole GPUs."""
    mig_allowed: frozenset[str] | None = None
    """The MIG devices (UUIDs) it may have, from CUDA_VISIBLE_DEVICES; `None`: any."""
    mig_excluded: frozenset[str] = frozenset()
    max_used_bytes: int | None = None
    """The most memory in use on a GPU it may have; `None`: the default for its kind."""
    allow_busy: bool = False
    """GPUs in use may be given too (chosen by free memory only), as with `mem_bytes`."""
    allow_unknown_holders: bool = False
    """Devices whose holders nobody can tell (the node's scheduler down, slow or malformed)
    may be given too: the user takes the risk that a job of the cluster holds them."""

    @property
    def wants_idle(self) -> bool:
        """Only GPUs nobody uses: an exclusive request that did not allow busy ones."""
        return self.mem_bytes is None and not self.allow_busy

    @property
    def judged_as_default(self) -> bool:
        """Whether each GPU is judged for it as for `Request()`: whole GPUs, idle ones, at
        the default limits, from any GPU. Then a node's own verdict on each GPU (the
        daemon's `gpuwatch_memory_available_bytes`) decides which it could have; only the count,
        free memory and strategy differ, and they are read apart."""
        return (
            self.wants_idle
            and self.mig is None
            and self.max_util_pct is None
            and self.max_used_bytes is None
            and self.allowed is None
            and not self.excluded
            and not self.allow_unknown_holders
        )

    @property
    def util_limit_pct(self) -> float | None:
        """The most utilization a GPU it may have shows, now or recently; `None`: any."""
        if self.max_util_pct is not None:
            return self.max_util_pct
        return IDLE_MAX_UTIL_PCT if self.wants_idle else None

    @property
    def used_limit_bytes(self) -> int | None:
        """The most memory in use on a GPU it may have; `None`: any."""
        if self.max_used_bytes is not None:
            return self.max_used_bytes
        return IDLE_MAX_USED_BYTES if self.wants_idle else None


class Waiter(msgspec.Struct, frozen=True):
    """A job that asked earlier and is still waiting: GPUs it can use are kept for it."""

    pid: int
    user: str
    request: Request
    waited_s: float = 0.0
    """How long it has been in line."""


def checked_request(
    *,
    n: int,
    min_free: int | str | None,
    max_util: float | None,
    mem: int | str | None,
    max_used: int | str | None,
    allow_busy: bool,
    allow_unknown_holders: bool,
    strategy: str,
    mig: str | None,
) -> Request:
    """The request `gpuwatch.select()`'s arguments state, each checked; each error names the
    argument as the caller wrote it (`min_free: ...`)."""
    return Request(
        count=checked("n", check_gpu_count, n),
        min_free_bytes=_bytes(min_free, "min_free"),
        max_util_pct=None if max_util is None else checked("max_util", check_percent, max_util),
        mem_bytes=_declared_bytes(mem),
        max_used_bytes=_bytes(max_used, "max_used"),
        allow_busy=checked("allow_busy", _check_flag, allow_busy),
        allow_unknown_holders=checked("allow_unknown_holders", _check_flag, allow_unknown_holders),
        strategy=Strategy(one_of(Strategy, strategy, "strategy")),
        mig=None if mig is None else checked("mig", check_mig, mig),
    )


def checked(name: str, check: Callable[[Any], Any], value: Any) -> Any:
    """`check(value)`, its error named after the argument `name`."""
    try:
        return check(value)
    except InvalidValueError as error:
        raise InvalidValueError(f"{name}: {error}") from None


def _declared_bytes(mem: object) -> int | None:
    declared = _bytes(mem, "mem")
    if declared is not None and declared <= 0:  # a share of nothing would fit on any GPU
        raise InvalidValueError(f"mem={mem!r} declares no memory: give what the job will use")
    return declared


def _check_flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidValueError(f"{value!r}: give True or False")
    return value


def _bytes(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise InvalidValueError(f"{name}={value!r}: give bytes (an int) or a size such as 8GiB")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise InvalidValueError(f"{name}={value!r}: give bytes (an int) or a size such as 8GiB")
    try:
        return parse_size(value, unit_required=True)
    except InvalidValueError as error:
        raise InvalidValueError(f"{name}: {error}") from None


def describe_wish(request: Request) -> str:
    """`2 idle GPUs with 8.0GiB free at most 50% busy` for messages."""
    noun = "GPU" if request.mig is None else "MIG device"
    idle = "idle " if request.wants_idle else ""
    parts = [f"{request.count} {idle}{noun}{'s' if request.count > 1 else ''}"]
    if request.mig not in (None, MIG_ANY):
        parts.append(f"({request.mig})")
    needed = max(request.min_free_bytes or 0, request.mem_bytes or 0)
    if needed:
        parts.append(f"with {format_size(needed)} free")
    if request.max_util_pct is not None:
        parts.append(f"at most {request.max_util_pct:g}% busy")
    if request.max_used_bytes is not None:
        parts.append(f"with at most {format_size(request.max_used_bytes)} used")
    return " ".join(parts)
