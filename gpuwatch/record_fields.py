"""Checked fields of structured input that another user or machine wrote: JSON records
(leases, tickets, training and OOM reports, the daemon's jobs) and configuration tables (a
simulated node's scenario, the fleet's config file, the daemon's web config).

One set of checks for all of them. Each getter returns the field when it has the right
type and lies in range, and raises `BadRecord` (a `Malformed`) naming the field and what
it should be otherwise. Booleans are not numbers here, NaN and infinities are never
numbers, and text is printable unless a caller says otherwise: a name full of terminal
escapes would repaint whoever displays it. A `Table` reads a configuration table with the
same getters, refusing keys it does not know and naming `where` each one is, in the
error its reader raises.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeVar

_T = TypeVar("_T")

MAX_BYTES = 1 << 53  # far above any GPU's memory, and exact as a float in every JSON reader
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_COUNT = 1 << 53  # the largest integer a JSON reader that uses doubles keeps exact
MAX_TIME = 1e11  # Unix time in the year 5138: later than any real record's


class Malformed(Exception):
    """A record, or the file that holds it, that cannot be believed: skipped and counted."""


class BadRecord(Malformed, ValueError):
    """A field is missing, of the wrong type or out of range: like a lease record that
    cannot be believed, the file is skipped and counted."""


def int_field(data: dict[str, Any], name: str, low: int = 0, high: int = MAX_COUNT) -> int:
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(f"{name}: expected a whole number, got {_shown(value)}")
    if not low <= value <= high:
        raise BadRecord(f"{name}: {_shown(value)} is out of range: give {low} to {high}")
    return value


def float_field(data: dict[str, Any], name: str, low: float, high: float) -> float:
    """A number in [low, high] (finite bounds). Compared before any conversion: float() of a
    400-digit integer raises, and NaN and the infinities fail the comparison."""
    value = _present(data, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{name}: expected a number, got {_shown(value)}")
    if not low <= value <= high:
        raise BadRecord(f"{name}: {_shown(value)} is out of range: give {low:g} to {high:g}")
    return float(value)


def time_field(data: dict[str, Any], name: str) -> float:
    """A Unix time (seconds, from 0 to `MAX_TIME`)."""
    return float_field(data, name, 0, MAX_TIME)


def text_field(
    data: dict[str, Any], name: str, limit: int = 200, *, shortest: int = 0, printable: bool = True
) -> str:
    value = _present(data, name)
    if not isinstance(value, str):
        raise BadRecord(f"{name}: expected a string, got {_shown(value)}")
    if not shortest <= len(value) <= limit:
        raise BadRecord(f"{name}: {_shown(value)}: give {shortest} to {limit} characters")
    if printable and not value.isprintable():
        raise BadRecord(f"{name}: {_shown(value)}: not printable text")
    return value


def bool_field(data: dict[str, Any], name: str) -> bool:
    value = _present(data, name)
    if not isinstance(value, bool):
        raise BadRecord(f"{name}: expected true or false, got {_shown(value)}")
    return value


def list_field(data: dict[str, Any], name: str, limit: int) -> list[Any]:
    value = data.get(name, [])
    if not isinstance(value, list) or len(value) > limit:
        raise BadRecord(f"{name}: expected a list of at most {limit}")
    return value


def texts_field(
    data: dict[str, Any], name: str, limit: int, *, printable: bool = True
) -> list[str]:
    """A list of at most `limit` strings, each as `text_field` checks it (up to 200
    characters; printable unless the caller says)."""
    values = list_field(data, name, limit)
    return [text_field({name: value}, name, printable=printable) for value in values]


def table_field(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A table (a JSON object, a TOML table, a YAML mapping); `{}` where absent or null."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRecord(f"{name}: expected a table, got {_shown(value)}")
    return value


def bytes_field(data: dict[str, Any], name: str) -> int:
    return int_field(data, name, 0, MAX_BYTES)


def optional(
    data: dict[str, Any], name: str, check: Callable[[dict[str, Any], str], _T]
) -> _T | None:
    """`None` when the field is absent or null, else the field as `check` reads it."""
    return None if data.get(name) is None else check(data, name)


REQUIRED: Any = None
"""A `Table` getter's default that makes the key required."""


class Table:
    """A configuration table someone else wrote (a TOML table, a YAML mapping), read key by
    key with the record getters above: every key must be one of `known`, and each getter's
    failure is raised as `error("WHERE.KEY: what is wrong")` (`KEY: ...` where `where` is
    empty: a file's top level, which its reader names), `error` being the reader's own
    (a scenario's `ScenarioError`, a config file's `InvalidValueError`). A getter's default
    is returned where the key is absent; `REQUIRED` makes it required."""

    def __init__(
        self,
        data: object,
        where: str,
        known: Collection[str],
        error: Callable[[str], Exception] = BadRecord,
    ) -> None:
        self.where, self.error = where, error
        if not isinstance(data, dict):
            raise self._failed(f"expected a table, got {_shown(data)}")
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            raise self._failed(
                f"unknown key {_shown(unknown[0])}; known keys: {', '.join(sorted(known))}"
            )
        self.data: dict[str, Any] = data

    def string(
        self, key: str, default: str | None = REQUIRED, *, limit: int = 200, printable: bool = True
    ) -> str:
        value: str = self._field(key, default, text_field, limit, printable=printable)
        return value

    def integer(self, key: str, default: int | None = REQUIRED, *, low: int, high: int) -> int:
        value: int = self._field(key, default, int_field, low, high)
        return value

    def number(
        self, key: str, default: float | None = REQUIRED, *, low: float, high: float
    ) -> float:
        value: float = self._field(key, default, float_field, low, high)
        return value

    def boolean(self, key: str, default: bool | None = REQUIRED) -> bool:
        value: bool = self._field(key, default, bool_field)
        return value

    def strings(self, key: str, *, limit: int, printable: bool = True) -> list[str]:
        value: list[str] = self._field(key, [], texts_field, limit, printable=printable)
        return value

    def mapping(self, key: str) -> dict[Any, Any]:
        """The table at `key`, unread (`{}` where absent or null): read it as a `Table` of its
        own, or entry by entry where its keys are data (user names)."""
        value: dict[Any, Any] = self._field(key, {}, table_field)
        return value

    def tables(self, key: str, *, limit: int) -> list[Any]:
        """The entries of `[[key]]`, each to be read as a `Table` of its own."""
        value: list[Any] = self._field(key, [], list_field, limit)
        return value

    def _field(
        self, key: str, default: Any, check: Callable[..., Any], *args: Any, **options: Any
    ) -> Any:
        if key not in self.data:
            if default is REQUIRED:
                raise self._failed(f"{key} is required")
            return default
        try:
            return check(self.data, key, *args, **options)
        except BadRecord as bad:
            raise self.error(f"{self.where}.{bad}" if self.where else str(bad)) from None

    def _failed(self, message: str) -> Exception:
        return self.error(f"{self.where}: {message}" if self.where else message)


def _present(data: dict[str, Any], name: str) -> Any:
    if name not in data:
        raise BadRecord(f"{name}: missing")
    return data[name]


def _shown(value: object) -> str:
    """`value` as an error shows it: its repr, cut to 40 characters; an integer too long to
    print (Python refuses past 4,300 digits) by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a whole number of {value.bit_length()} bits"
    return f"{value!r:.40}"
