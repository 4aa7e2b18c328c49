"""Checked fields of JSON records that another user may have written (reports, OOM reports).

Each getter returns the field when it has the right type and lies in range, and
raises `BadRecord` (a `gpuwatch.lease_records.Malformed`) otherwise. Booleans
are not numbers here, NaN and infinities are never numbers, and text must be
printable: a name full of terminal escapes would repaint whoever displays it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from gpuwatch.lease_records import Malformed

MAX_BYTES = 1 << 60  # 1 EiB: more than any device, small enough for every JSON reader
MAX_COUNT = 1 << 53  # the largest integer a JSON reader that uses doubles keeps exact

_T = TypeVar("_T")


class BadRecord(Malformed, ValueError):
    """A field is missing, of the wrong type or out of range: like a lease record that
    cannot be believed, the file is skipped and counted."""


def int_field(data: dict[str, Any], name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRecord(f"{name}: {value!r:.40}")
    return value


def float_field(data: dict[str, Any], name: str, low: float, high: float) -> float:
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{name}: {value!r:.40}")
    if not math.isfinite(value) or not low <= value <= high:
        raise BadRecord(f"{name}: {value!r:.40}")
    return float(value)


def text_field(data: dict[str, Any], name: str, limit: int = 200) -> str:
    value = _present(data, name)
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise BadRecord(f"{name}: {value!r:.40}")
    return value


def bool_field(data: dict[str, Any], name: str) -> bool:
    value = _present(data, name)
    if not isinstance(value, bool):
        raise BadRecord(f"{name}: {value!r:.40}")
    return value


def list_field(data: dict[str, Any], name: str, limit: int) -> list[Any]:
    value = data.get(name, [])
    if not isinstance(value, list) or len(value) > limit:
        raise BadRecord(f"{name}: not a list of at most {limit}")
    return value


def bytes_field(data: dict[str, Any], name: str) -> int:
    return int_field(data, name, 0, MAX_BYTES)


def optional(
    data: dict[str, Any], name: str, check: Callable[[dict[str, Any], str], _T]
) -> _T | None:
    """`None` when the field is absent or null, else the field as `check` reads it."""
    return None if data.get(name) is None else check(data, name)


def _present(data: dict[str, Any], name: str) -> Any:
    if name not in data:
        raise BadRecord(f"{name}: missing")
    return data[name]
