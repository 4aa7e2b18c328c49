"""What a lease or ticket file says, checked: every field typed and in range; and the
request's JSON form a ticket carries (`request_record`, `request_from_record`).

Any user can write these files, so each is read like a command-line argument
from a stranger. A record that fails any check raises `Malformed`, and its
file is skipped (and counted) as if it were absent; nothing out of range
reaches a table, a metric or JSON.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuwatch.choices import Strategy
from gpuwatch.leases.locking import FileKey, file_key, process_uids
from gpuwatch.models import Lease
from gpuwatch.record_fields import (
    MAX_BYTES,
    MAX_PID,
    BadRecord,
    Malformed,
    float_field,
    int_field,
    optional,
    text_field,
)
from gpuwatch.request import Request, Waiter

_T = TypeVar("_T")

MAX_COMMAND_CHARS = 4096
_MAX_GPU_INDEX = 1 << 16
_MAX_UUID_CHARS = 256
_LATEST_TIME_S = 253402300799.0  # the end of year 9999: any clock, however wrong
_TICKET_NAME = r"(\d{20})-\d{1,10}-[0-9a-f]{8}\.wait"  # compiled on first use, by re's cache
_MAX_NAME_CHARS = 128
_MAX_REQUEST_COUNT = 1 << 16


def record_from(raw: bytes, path: str) -> dict[str, Any]:
    try:
        data = json.loads(raw or b"null")
    except (ValueError, RecursionError) as error:  # not JSON, or nested to crash parsers
        raise Malformed(path) from error
    if not isinstance(data, dict):
        raise Malformed(path)
    return data


def lease_from(data: dict[str, Any], *, lease_id: str, user: str) -> Lease:
    """A lease from a record, each field type- and range-checked; raises `Malformed` when
    one that says which GPU is held, or by whom, cannot be believed."""
    return Lease(
        gpu_uuid=text_field(data, "gpu_uuid", _MAX_UUID_CHARS, shortest=1, printable=False),
        gpu_index=int_field(data, "gpu_index", 0, _MAX_GPU_INDEX),
        pid=int_field(data, "pid", 1, MAX_PID),
        user=user,
        # A command line may hold any character: whoever displays it escapes it.
        command=_lenient(data, "command", _command, "(unreadable)"),
        started_at=_lenient(data, "started_at", _started_at, time.time()),
        # A declaration that cannot be read claims the whole GPU: the reading that frees none.
        mem_bytes=_lenient(data, "mem_bytes", _declared_bytes, None),
        lease_id=lease_id,
    )


def waiter_from(
    name: str,
    data: dict[str, Any],
    info: os.stat_result,
    user: str,
    *,
    holders: dict[FileKey, list[int]],
    now_ns: int,
) -> Waiter:
    """A waiting job from its ticket, or `Malformed` for a ticket that cannot be believed."""
    match = re.fullmatch(_TICKET_NAME, name)
    queued_ns = int(match.group(1)) if match else now_ns + 1
    pid = int_field(data, "pid", 1, MAX_PID)
    uids = process_uids(pid)
    lockers = holders.get(file_key(info))
    if queued_ns > now_ns or not uids or info.st_uid not in uids:
        raise Malformed(name)  # misdated, or for a dead process or someone else's
    if lockers is not None and pid not in lockers:
        raise Malformed(name)  # the process it names does not hold it
    try:
        request = request_from_record(data.get("request"))
    except BadRecord as error:
        raise Malformed(name) from error
    return Waiter(pid, user, request, waited_s=(now_ns - queued_ns) / 1e9)


def _lenient(
    data: dict[str, Any], name: str, check: Callable[[dict[str, Any], str], _T], bad: _T
) -> _T:
    """`check`'s reading of a field that does not say which GPU is held, or `bad`: a lease
    whose lock is held is in force whatever such a field says."""
    try:
        return check(data, name)
    except Malformed:
        return bad


def _command(data: dict[str, Any], name: str) -> str:
    return text_field(data, name, MAX_COMMAND_CHARS, printable=False)


def _declared_bytes(data: dict[str, Any], name: str) -> int | None:
    return optional(data, name, _lease_bytes)


def _started_at(data: dict[str, Any], name: str) -> float:
    """When the lease was taken, as `time.time()` wrote it; no later than now.

    A lease whose lock is held is in force whatever its clock said: one written
    before the wall clock stepped back is dated in the future, and reads as
    taken now rather than being skipped (which would free its GPU for another).
    """
    return min(float_field(data, name, 0, _LATEST_TIME_S), time.time())


def _lease_bytes(data: dict[str, Any], name: str) -> int:
    return int_field(data, name, 0, MAX_BYTES)


def request_record(request: Request) -> dict[str, Any]:
    """The JSON form of a request, as a waiting ticket carries it."""
    return {
        "count": request.count,
        "min_free_bytes": request.min_free_bytes,
        "max_util_pct": request.max_util_pct,
        "mem_bytes": request.mem_bytes,
        "strategy": request.strategy.value,
        "allowed": None if request.allowed is None else sorted(request.allowed),
        "excluded": sorted(request.excluded),
        "max_used_bytes": request.max_used_bytes,
        "allow_busy": request.allow_busy,
        "allow_unknown_holders": request.allow_unknown_holders,
        **_mig_record(request),
    }


def request_from_record(data: object) -> Request:
    """The inverse of `request_record`, strict: raises `BadRecord` (a `ValueError` and a
    `Malformed`) for anything malformed, since tickets come from a directory every user
    can write to. Fields older versions did not write take their defaults."""
    if not isinstance(data, dict) or "count" not in data:
        raise BadRecord(f"not a request: {data!r:.40}")
    allowed = data.get("allowed")
    allow_busy, allow_unknown = (
        data.get(name, False) for name in ("allow_busy", "allow_unknown_holders")
    )
    if not isinstance(allow_busy, bool) or not isinstance(allow_unknown, bool):
        raise BadRecord(f"not a boolean: {allow_busy!r:.40}, {allow_unknown!r:.40}")
    return Request(
        count=_number(data["count"], int, 1, _MAX_REQUEST_COUNT),
        min_free_bytes=_optional_number(data.get("min_free_bytes"), int, MAX_BYTES),
        max_util_pct=_optional_number(data.get("max_util_pct"), float, 100),
        mem_bytes=_optional_number(data.get("mem_bytes"), int, MAX_BYTES),
        strategy=_strategy(data),
        allowed=None if allowed is None else _indices(allowed),
        excluded=_indices(data.get("excluded", [])),
        max_used_bytes=_optional_number(data.get("max_used_bytes"), int, MAX_BYTES),
        allow_busy=allow_busy,
        allow_unknown_holders=allow_unknown,
        **_mig_from_record(data),
    )


def _mig_record(request: Request) -> dict[str, Any]:
    if request.mig is None:
        return {}  # a ticket as older versions write it
    allowed = request.mig_allowed
    return {
        "mig": request.mig,
        "mig_allowed": None if allowed is None else sorted(allowed),
        "mig_excluded": sorted(request.mig_excluded),
    }


def _mig_from_record(data: dict[str, Any]) -> dict[str, Any]:
    mig, allowed = data.get("mig"), data.get("mig_allowed")
    if mig is not None and not (isinstance(mig, str) and 0 < len(mig) <= _MAX_NAME_CHARS):
        raise BadRecord(f"not a MIG profile: {mig!r:.40}")
    return {
        "mig": mig,
        "mig_allowed": None if allowed is None else _uuids(allowed),
        "mig_excluded": _uuids(data.get("mig_excluded", [])),
    }


def _strategy(data: dict[str, Any]) -> Strategy:
    value = data.get("strategy", Strategy.MOST_FREE.value)
    if isinstance(value, str) and value in {strategy.value for strategy in Strategy}:
        return Strategy(value)
    raise BadRecord(f"not a strategy: {value!r:.40}")


def _uuids(values: object) -> frozenset[str]:
    if not isinstance(values, list) or not all(
        isinstance(value, str) and value.startswith("MIG-") and len(value) <= _MAX_NAME_CHARS
        for value in values
    ):
        raise BadRecord(f"not a list of MIG device UUIDs: {values!r:.40}")
    return frozenset(values)


def _number(value: object, kind: type, minimum: float, maximum: float) -> Any:
    ok_types = (int, float) if kind is float else (int,)
    # Range first: NaN fails it, and an int too large for a float never meets float().
    if (
        isinstance(value, bool)
        or not isinstance(value, ok_types)
        or not minimum <= value <= maximum
    ):
        raise BadRecord(f"not a {kind.__name__} in [{minimum}, {maximum}]: {value!r:.40}")
    return kind(value)


def _optional_number(value: object, kind: type, maximum: float) -> Any:
    return None if value is None else _number(value, kind, 0, maximum)


def _indices(values: object) -> frozenset[int]:
    if not isinstance(values, list) or len(values) > _MAX_REQUEST_COUNT:
        raise BadRecord("not a list of GPU indices")
    return frozenset(_number(value, int, 0, _MAX_REQUEST_COUNT) for value in values)
