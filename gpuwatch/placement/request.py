"""What a job asks for (`Request`) and a job waiting in line (`Waiter`): the inputs of the
placement rules, plain values with no I/O.

The strict JSON form of a request, which waiting tickets carry, lives with the other
records read from the lease directory: `gpuwatch.leases.records`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch._frozen import FrozenValue
from gpuwatch.placement.choices import Strategy

IDLE_MAX_UTIL_PCT = 5.0
"""The utilization above which a GPU counts as in use, unless `--max-util` says otherwise."""
IDLE_MAX_USED_BYTES = 1 << 30
"""The memory in use (beyond the driver's reserve) above which a GPU counts as in use,
unless `--max-used` says otherwise."""


@dataclass(frozen=True, slots=True, eq=False, repr=False)  # FrozenValue has them
class Request(FrozenValue):
    """What a job asks for. GPU sets hold NVML indices."""

    count: int = 1
    min_free_bytes: int | None = None
    max_util_pct: float | None = None
    mem_bytes: int | None = None
    """Memory the job declares it will use: the lease is then shared. `None`: exclusive."""
    strategy: Strategy = Strategy.MOST_FREE
    allowed: frozenset[int] | None = None
    """The GPUs it may have (from CUDA_VISIBLE_DEVICES); `None`: any."""
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

    @property
    def wants_idle(self) -> bool:
        """Only GPUs nobody uses: an exclusive request that did not allow busy ones."""
        return self.mem_bytes is None and not self.allow_busy

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


@dataclass(frozen=True, slots=True, eq=False, repr=False)  # FrozenValue has them
class Waiter(FrozenValue):
    """A job that asked earlier and is still waiting: GPUs it can use are kept for it."""

    pid: int
    user: str
    request: Request
    waited_s: float = 0.0
    """How long it has been in line."""
