"""Polling for a condition, instead of sleeping a fixed time (tests run on loaded machines).

`wait_until` is the one way a test waits for something another process or thread does;
`wait_until_async` is its twin for a Textual Pilot, whose app runs only while the test awaits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# What the thing polled may raise before it is there: a socket not yet bound, a file not yet
# written. It counts as "not yet", and the last one is named if the wait runs out.
NOT_YET: tuple[type[Exception], ...] = (OSError,)


class _Poll:
    """One wait's deadline and what it saw last, for the message when it runs out."""

    def __init__(self, message: str, timeout_s: float) -> None:
        self.message = message
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.last: object = None
        self.error: Exception | None = None

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def failure(self) -> AssertionError:
        error = f" (last error: {self.error!r})" if self.error is not None else ""
        return AssertionError(
            f"timed out after {self.timeout_s:g} s waiting for {self.message}; "
            f"last value seen: {self.last!r}{error}"
        )


def _check(poll: _Poll, predicate: Callable[[], T]) -> T | None:
    """The predicate's value if truthy; None for "not yet"."""
    try:
        value = predicate()
    except NOT_YET as error:
        poll.error = error
        return None
    poll.last = value
    return value if value else None


def wait_until(
    predicate: Callable[[], T],
    message: str,
    *,
    timeout_s: float = 30,
    interval_s: float = 0.05,
) -> T:
    """Calls `predicate` every `interval_s` until it returns something truthy, and returns that.

    Fails the test after `timeout_s` with `message` and the last value (or error) seen.
    """
    poll = _Poll(message, timeout_s)
    while True:
        if (result := _check(poll, predicate)) is not None:
            return result
        if poll.expired():
            raise poll.failure()
        time.sleep(interval_s)


async def wait_until_async(
    predicate: Callable[[], T],
    message: str,
    *,
    pause: Callable[[float], Awaitable[object]],
    timeout_s: float = 30,
    interval_s: float = 0.05,
) -> T:
    """`wait_until` inside a running Textual app: `pause` (a Pilot's) lets the app run between
    calls, where a sleep would stop it."""
    poll = _Poll(message, timeout_s)
    while True:
        if (result := _check(poll, predicate)) is not None:
            return result
        if poll.expired():
            raise poll.failure()
        await pause(interval_s)
