"""The poller: samples a backend at a steady interval."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.models import Snapshot


def ticks(
    interval_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[int]:
    """Yields 0, 1, 2, ... one every `interval_s`, without drift.

    Each tick is due at start + n * interval; a tick that comes late is not
    made up for by bunching the next ones: missed ticks are skipped.
    """
    start = clock()
    number = 0
    while True:
        yield number
        number += 1
        now = clock()
        due = start + number * interval_s
        if due < now:
            number = int((now - start) / interval_s) + 1
            due = start + number * interval_s
        sleep(due - now)


def watch(
    backend: Backend,
    interval_s: float,
    *,
    count: int | None = None,
    scope: SampleScope = SampleScope.FULL,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Snapshot]:
    """Samples `backend` every `interval_s`, `count` times (forever when `None`)."""
    for number in ticks(interval_s, sleep=sleep):
        yield backend.sample(scope)
        if number + 1 == count:
            return
