"""Human sizes and durations, both ways.

Sizes follow `dd` and nvidia-smi: `K`, `M`, `G`, `T` and `KiB` ... `TiB` are
binary (1024-based), `KB` ... `TB` are decimal; a bare number is bytes.
(Parsed by hand rather than with `re`, which `gpuwatch.select()` would
otherwise pay to import.)
"""

from __future__ import annotations

import re

from gpuwatch.errors import InvalidValueError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_SIZE_BYTES = 1 << 50
"""The largest size any value may name (1PiB): far above any GPU, far below overflow."""
MAX_DURATION_S = 10_000 * 86400.0
"""The longest duration any value may name (10000d, within what every timer of the
standard library takes); each option may allow less."""
_MAX_DIGITS = 30  # longer numbers are typos or attacks, and int() of 4,300 digits raises


def parse_size(text: str, *, unit_required: bool = False) -> int:
    """Bytes in a human size; with `unit_required`, a bare number is refused (`--min-free 10`
    is far likelier a forgotten `GiB` than ten bytes), and bytes are written `10B`.

    >>> parse_size("8GiB"), parse_size("500MB"), parse_size("1.5G")
    (8589934592, 500000000, 1610612736)
    """
    number, unit = _split(text)
    factor = _SIZE_UNITS.get(unit.lower())
    if number is None or factor is None:
        raise InvalidValueError(f"{_shown(text)} is not a size: use e.g. 8GiB, 500MB or 1.5G")
    if unit_required and not unit:
        raise InvalidValueError(
            f"{_shown(text)} has no unit: write e.g. {number:g}GiB, {number:g}MB, "
            f"or {number:g}B for bytes"
        )
    if number * factor > MAX_SIZE_BYTES:
        raise InvalidValueError(f"{_shown(text)} is too large: the most is 1024TiB")
    return int(number * factor)


def parse_duration(text: str, *, most_s: float = MAX_DURATION_S) -> float:
    """Seconds in a human duration: `500ms`, `1.5s`, `10m`, `24h`, `2d`, or plain seconds."""
    number, unit = _split(text)
    factor = _DURATION_UNITS.get(unit.lower())
    if number is None or factor is None:
        raise InvalidValueError(
            f"{_shown(text)} is not a duration: use e.g. 500ms, 30s, 10m or 24h"
        )
    if number * factor > min(most_s, MAX_DURATION_S):
        most = format_duration(min(most_s, MAX_DURATION_S))
        raise InvalidValueError(f"{_shown(text)} is too long: the most is {most}")
    return number * factor


def format_duration(seconds: float) -> str:
    """The largest unit that says `seconds` exactly: `format_duration(86400) == '1d'`."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{seconds * 1000:g}ms"


def format_span(seconds: float) -> str:
    """A time gone by, to the unit that matters: `45s`, `12m`, `3h05m`, `2d04h`."""
    whole = int(max(0.0, seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def parse_whole_number(text: str, *, low: int, high: int) -> int:
    """A whole number from `low` to `high`, in ASCII digits only.

    `int()` alone would take `' 3'`, `'1_000'` and `'٣'` (an Arabic-Indic three).
    """
    stripped = text.strip()
    if not (stripped.isdigit() and stripped.isascii()):
        raise InvalidValueError(f"{_shown(text)} is not a whole number")
    value = int(stripped) if len(stripped) <= _MAX_DIGITS else None
    if value is None or not low <= value <= high:
        raise InvalidValueError(f"{_shown(stripped)} is out of range: give {low} to {high:,}")
    return value


def parse_number(text: str, *, low: float, high: float) -> float:
    """A plain decimal number (`12`, `0.5`) from `low` to `high`: no `nan`, `inf` or `1e3`."""
    number, unit = _split(text)
    if number is None or unit:
        raise InvalidValueError(f"{_shown(text)} is not a number")
    if not low <= number <= high:
        raise InvalidValueError(f"{_shown(text)} is out of range: give {low:g} to {high:g}")
    return number


def counted(count: int, noun: str) -> str:
    """`1 GPU`, `2 GPUs`: a count with its noun, singular or plural as English has it."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_size(num_bytes: int, *, precision: int = 1) -> str:
    """A binary size for people: `format_size(3 << 30) == '3.0GiB'`."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.{precision}f}{unit}"
        value /= 1024
    return f"{value:.{precision}f}TiB"


def _split(text: str) -> tuple[float | None, str]:
    """`' 1.5 GiB '` -> `(1.5, 'GiB')`; the number is `None` unless it is plain decimal digits."""
    stripped = text.strip()
    end = len(stripped)
    while end and stripped[end - 1].isalpha():
        end -= 1
    number, unit = stripped[:end].strip(), stripped[end:]
    digits = number.replace(".", "", 1)
    if not (digits.isdigit() and digits.isascii()):
        return None, unit
    return float(number), unit


def _shown(text: str) -> str:
    """`text` quoted for a message, and cut short: a value can be megabytes long."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


MIG_ANY = "any"
# A MIG profile names a slice of a GPU by its size; the simulated backend checks the profiles
# of a scenario with this as pick and select() check theirs. Left to `re`'s cache.
_MIG_PROFILE = r"[1-8]g\.\d{1,4}gb(\+me)?"


def check_mig(value: str) -> str:
    """A MIG profile as drivers name them (`1g.10gb`, `3g.40gb`, `1g.10gb+me`) or `any`."""
    if value == MIG_ANY or re.fullmatch(_MIG_PROFILE, value):
        return value
    raise InvalidValueError(f"{value!r}: give a MIG profile such as 1g.10gb or 3g.40gb, or any")
