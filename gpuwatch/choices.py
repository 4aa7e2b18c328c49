"""The named choices and checked numbers shared by `gpuwatch pick` and `gpuwatch.select()`.

Vocabulary, kept apart from the policy: it sits below the leases, which record it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from gpuwatch.errors import InvalidValueError
from gpuwatch.units import MIG_ANY, check_mig

__all__ = ["MIG_ANY", "check_mig"]  # re-exported: the simulated backend checks profiles too


class Strategy(enum.StrEnum):
    """How qualifying GPUs are ranked."""

    MOST_FREE = "most-free"
    """Most free memory first: the safest home for a job of unknown size."""
    LEAST_UTIL = "least-util"
    """Least busy first: for jobs that need compute more than memory."""
    PACK = "pack"
    """Least free memory that still fits first: fills shared GPUs, keeps big ones whole."""


WISHES: tuple[tuple[str, str, str], ...] = (
    # (the Request field, or `exclude`; select()'s argument; pick's option)
    ("count", "n", "--gpus"),
    ("min_free_bytes", "min_free", "--min-free"),
    ("max_util_pct", "max_util", "--max-util"),
    ("mem_bytes", "mem", "--mem"),
    ("max_used_bytes", "max_used", "--max-used"),
    ("allow_busy", "allow_busy", "--allow-busy"),
    ("allow_unknown_holders", "allow_unknown_holders", "--allow-unknown-holders"),
    ("strategy", "strategy", "--strategy"),
    ("exclude", "exclude", "--exclude"),
    ("mig", "mig", "--mig"),
)
"""What a job may wish for, and how `gpuwatch.select()` and `gpuwatch pick` name each wish:
one list, so that the two build the same request and speak of it in their own words."""


def said(field: str, value: object, *, by_pick: bool) -> str:
    """A wish as its front end writes it, for messages: `--mig 1g.10gb` for pick,
    `mig='1g.10gb'` for select()."""
    argument, option = next((arg, opt) for name, arg, opt in WISHES if name == field)
    return f"{option} {value}" if by_pick else f"{argument}={value!r}"


def named(field: str, *, by_pick: bool) -> str:
    """A wish's name as its front end writes it: `--exclude` for pick, `exclude` for select()."""
    argument, option = next((arg, opt) for name, arg, opt in WISHES if name == field)
    return option if by_pick else argument


class Format(enum.StrEnum):
    """How chosen GPUs are written into the child's CUDA_VISIBLE_DEVICES."""

    UUID = "uuid"
    """`GPU-...` UUIDs: right whatever the CUDA_DEVICE_ORDER."""
    INDEX = "index"
    """nvidia-smi indices, with CUDA_DEVICE_ORDER=PCI_BUS_ID set beside them."""


def one_of(kind: type[enum.StrEnum], value: str, name: str) -> str:
    """`value` as a member of `kind`, or an error listing the choices."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(member.value for member in kind)
        raise InvalidValueError(f"{name}={value!r}: choose one of {choices}") from None


def check_gpu_count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidValueError(f"{count!r}: ask for at least 1 GPU")
    return count


def exclude_entries(value: object) -> tuple[str, ...]:
    """GPUs to exclude as `gpuwatch pick --exclude` and `select(exclude=...)` take them: text
    of comma-separated indices or UUIDs (`"1,2"`; a string is never read letter by letter),
    an index, or an iterable of indices and such texts."""
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        items: Iterable[object] = [value]
    elif isinstance(value, Iterable):
        items = value
    else:
        raise InvalidValueError(f'{value!r}: give GPU indices or UUIDs, e.g. "1,2"')
    entries: list[str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise InvalidValueError(f"{item!r} is not a GPU index or UUID")
        if isinstance(item, int) and item < 0:
            raise InvalidValueError(f"{item!r} is not a GPU index or UUID")
        parts = [part.strip() for part in str(item).split(",")]
        if not all(parts):
            raise InvalidValueError(
                f"{str(item)!r} has an empty entry: give indices or UUIDs separated by "
                "commas, e.g. 1,2"
            )
        entries.extend(parts)
    return tuple(entries)


def check_percent(value: float) -> float:
    if not 0 <= value <= 100:
        raise InvalidValueError(f"{value:g} is not a percentage from 0 to 100")
    return value


def check_one_mig_device(count: int, where: str) -> None:
    """CUDA shows a process one MIG device, however many CUDA_VISIBLE_DEVICES names."""
    if count > 1:
        raise InvalidValueError(
            f"{count} MIG devices for one {where}: CUDA gives a process only one MIG device. "
            "Start one job per MIG device (each with its own gpuwatch pick --mig), or leave "
            "out COMMAND to print the choice for a launcher that hands one to each rank"
        )
