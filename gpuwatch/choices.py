"""The named choices and checked numbers shared by `gpuwatch pick` and `gpuwatch.select()`.

Kept apart from the policy so that checking a caller's arguments loads nothing
heavy (the data model is loaded only once there is a GPU to choose).
"""

from __future__ import annotations

import enum

from gpuwatch.errors import InvalidValueError


class Strategy(enum.StrEnum):
    """How qualifying GPUs are ranked."""

    MOST_FREE = "most-free"
    """Most free memory first: the safest home for a job of unknown size."""
    LEAST_UTIL = "least-util"
    """Least busy first: for jobs that need compute more than memory."""
    PACK = "pack"
    """Least free memory that still fits first: fills shared GPUs, keeps big ones whole."""


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


def check_percent(value: float) -> float:
    if not 0 <= value <= 100:
        raise InvalidValueError(f"{value:g} is not a percentage from 0 to 100")
    return value
