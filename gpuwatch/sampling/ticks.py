"""Sampling at a steady interval, for a command that shows the GPUs again and again
(`gpuwatch status --watch`, the TUI): `ticks` and `watch`. The daemon's own loop is
`gpuwatch.sampling.poller`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.models import Snapshot


def ticks(
    interval_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
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
    on_unavailable: Callable[[DaemonUnavailableError], None] | None = None,
) -> Iterator[Snapshot]:
    """Samples `backend` every `interval_s`, `count` times (forever when `None`).

    With `on_unavailable`, a tick whose sample the daemon could not give (it
    restarts, or hangs) is told to it and skipped, and the watch goes on; the
    tick still counts, so that `count` bounds how long a watch runs.
    """
    for number in ticks(interval_s, sleep=sleep):
        try:
            snapshot = backend.sample(scope)
        except DaemonUnavailableError as error:
            if on_unavailable is None:
                raise
            on_unavailable(error)
        else:
            yield snapshot
        if number + 1 == count:
            return
