"""What a lease or ticket file says, checked: every field typed and in range.

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

from gpuwatch.leases.locking import FileKey, file_key, process_uids
from gpuwatch.models import Lease
from gpuwatch.record_fields import (
    MAX_BYTES,
    MAX_PID,
    Malformed,
    float_field,
    int_field,
    optional,
    text_field,
)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from gpuwatch.placement.request import Waiter

    _T = TypeVar("_T")

MAX_COMMAND_CHARS = 4096
_MAX_GPU_INDEX = 1 << 16
_MAX_UUID_CHARS = 256
_LATEST_TIME_S = 253402300799.0  # the end of year 9999: any clock, however wrong
_TICKET_NAME = r"(\d{20})-\d{1,10}-[0-9a-f]{8}\.wait"  # compiled on first use, by re's cache


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
    from gpuwatch.placement.request import Request, Waiter  # only pickers read the line

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
        request = Request.from_dict(data["request"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
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
