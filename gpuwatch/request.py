"""What a job asks for (`Request`) and a job waiting in line (`Waiter`): the inputs of the
placement rules, plain values with no I/O.

The strict JSON form of a request, which waiting tickets carry, lives with the other
records read from the lease directory: `gpuwatch.leases.records`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.choices import MIG_ANY, WISHES, Strategy
from gpuwatch.units import format_size

IDLE_MAX_UTIL_PCT = 5.0
"""The utilization above which a GPU counts as in use, unless `--max-util` says otherwise."""
IDLE_MAX_USED_BYTES = 1 << 30
"""The memory in use (beyond the driver's reserve) above which a GPU counts as in use,
unless `--max-used` says otherwise."""


@dataclass(frozen=True, slots=True)
class Request:
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


@dataclass(frozen=True, slots=True)
class Waiter:
    """A job that asked earlier and is still waiting: GPUs it can use are kept for it."""

    pid: int
    user: str
    request: Request
    waited_s: float = 0.0
    """How long it has been in line."""


def request_of(wishes: Mapping[str, Any]) -> Request:
    """The request `wishes` state: a value for each of `choices.WISHES` (checked already),
    keyed by its field name; `exclude`, which names GPUs of one machine, is resolved by
    the caller against that machine."""
    asked = {name: wishes[name] for name, _, _ in WISHES if name != "exclude"}
    return Request(**{**asked, "strategy": Strategy(asked["strategy"])})


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
