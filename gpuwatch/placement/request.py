"""What a job asks for (`Request`) and a job waiting in line (`Waiter`): the inputs of the
placement rules, and the request's strict JSON form, which waiting tickets carry.

A ticket comes from a directory every user can write to, so `Request.from_dict` checks every
field's type and range and raises `ValueError` for anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuwatch.placement.choices import MIG_ANY, WISHES, Strategy
from gpuwatch.record_fields import MAX_BYTES
from gpuwatch.units import format_size

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_MAX_NAME_CHARS = 128
_MAX_COUNT = 1 << 16
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "min_free_bytes": self.min_free_bytes,
            "max_util_pct": self.max_util_pct,
            "mem_bytes": self.mem_bytes,
            "strategy": self.strategy.value,
            "allowed": None if self.allowed is None else sorted(self.allowed),
            "excluded": sorted(self.excluded),
            "max_used_bytes": self.max_used_bytes,
            "allow_busy": self.allow_busy,
            **_mig_to_dict(self),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        """The inverse of `to_dict`, strict: raises `ValueError` for anything malformed
        (waiting tickets come from a directory every user can write to)."""
        allowed = data.get("allowed")
        strategy = data.get("strategy", Strategy.MOST_FREE.value)
        if not isinstance(strategy, str):
            raise ValueError(f"not a strategy: {strategy!r}")
        allow_busy = data.get("allow_busy", False)
        if not isinstance(allow_busy, bool):
            raise ValueError(f"not a boolean: {allow_busy!r}")
        return cls(
            count=_number(data["count"], int, 1, _MAX_COUNT),
            min_free_bytes=_optional(data.get("min_free_bytes"), int, MAX_BYTES),
            max_util_pct=_optional(data.get("max_util_pct"), float, 100),
            mem_bytes=_optional(data.get("mem_bytes"), int, MAX_BYTES),
            strategy=Strategy(strategy),
            allowed=None if allowed is None else _indices(allowed),
            excluded=_indices(data.get("excluded", [])),
            max_used_bytes=_optional(data.get("max_used_bytes"), int, MAX_BYTES),
            allow_busy=allow_busy,
            **_mig_from_dict(data),
        )


def _mig_to_dict(request: Request) -> dict[str, Any]:
    if request.mig is None:
        return {}  # a ticket as older versions write it
    allowed = request.mig_allowed
    return {
        "mig": request.mig,
        "mig_allowed": None if allowed is None else sorted(allowed),
        "mig_excluded": sorted(request.mig_excluded),
    }


def _mig_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    mig, allowed = data.get("mig"), data.get("mig_allowed")
    if mig is not None and not (isinstance(mig, str) and 0 < len(mig) <= _MAX_NAME_CHARS):
        raise ValueError(f"not a MIG profile: {mig!r}")
    return {
        "mig": mig,
        "mig_allowed": None if allowed is None else _uuids(allowed),
        "mig_excluded": _uuids(data.get("mig_excluded", [])),
    }


def _uuids(values: object) -> frozenset[str]:
    if not isinstance(values, list) or not all(
        isinstance(value, str) and value.startswith("MIG-") and len(value) <= _MAX_NAME_CHARS
        for value in values
    ):
        raise ValueError(f"not a list of MIG device UUIDs: {values!r}")
    return frozenset(values)


def _number(value: object, kind: type, minimum: float, maximum: float) -> Any:
    ok_types = (int, float) if kind is float else (int,)
    # Range first: NaN fails it, and an int too large for a float never meets float().
    if (
        isinstance(value, bool)
        or not isinstance(value, ok_types)
        or not minimum <= value <= maximum
    ):
        raise ValueError(f"not a {kind.__name__} in [{minimum}, {maximum}]: {value!r}")
    return kind(value)


def _optional(value: object, kind: type, maximum: float) -> Any:
    return None if value is None else _number(value, kind, 0, maximum)


def _indices(values: object) -> frozenset[int]:
    if not isinstance(values, list) or len(values) > _MAX_COUNT:
        raise ValueError("not a list of GPU indices")
    return frozenset(_number(value, int, 0, _MAX_COUNT) for value in values)


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
