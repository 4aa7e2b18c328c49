"""Checked fields of JSON records that another user may have written: leases, tickets,
training reports, OOM reports.

Each getter returns the field when it has the right type and lies in range, and
raises `BadRecord` (a `Malformed`) otherwise. Booleans are not numbers here, NaN
and infinities are never numbers, and text is printable unless a caller says
otherwise: a name full of terminal escapes would repaint whoever displays it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

MAX_BYTES = 1 << 53  # far above any GPU's memory, and exact as a float in every JSON reader
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_COUNT = 1 << 53  # the largest integer a JSON reader that uses doubles keeps exact


class Malformed(Exception):
    """A record, or the file that holds it, that cannot be believed: skipped and counted."""


class BadRecord(Malformed, ValueError):
    """A field is missing, of the wrong type or out of range: like a lease record that
    cannot be believed, the file is skipped and counted."""


def int_field(data: dict[str, Any], name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRecord(f"{name}: {value!r:.40}")
    return value


def float_field(data: dict[str, Any], name: str, low: float, high: float) -> float:
    """A number in [low, high] (finite bounds). Compared before any conversion: float() of a
    400-digit integer raises, and NaN and the infinities fail the comparison."""
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRecord(f"{name}: {value!r:.40}")
    return float(value)


def text_field(
    data: dict[str, Any], name: str, limit: int = 200, *, shortest: int = 0, printable: bool = True
) -> str:
    value = _present(data, name)
    if not isinstance(value, str) or not shortest <= len(value) <= limit:
        raise BadRecord(f"{name}: {value!r:.40}")
    if printable and not value.isprintable():
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
