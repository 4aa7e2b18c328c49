"""The sampling threads: each runs one source and posts what it says to the app.

Threads never touch widgets: they post `BackfillArrived` once, then a `FrameArrived`
per frame, and the app applies them on its own thread. A sampler is a daemon thread,
so a hung driver never keeps the program from exiting.
"""

from __future__ import annotations

import threading

from textual.app import App
from textual.message import Message

from gpuwatch.tui.common.frames import Backfill, Frame
from gpuwatch.tui.node.sources import Source

SAMPLER_EXIT_WAIT_S = 2.0
"""How long the app waits, on exit, for samplers to finish their current read."""


class FrameArrived(Message):
    """Source `number` said something: a frame, good or failed."""

    def __init__(self, number: int, frame: Frame) -> None:
        super().__init__()
        self.number = number
        self.frame = frame


class BackfillArrived(Message):
    """Source `number`'s past (the daemon's history, when it keeps one), once, first."""

    def __init__(self, number: int, backfill: Backfill) -> None:
        super().__init__()
        self.number = number
        self.backfill = backfill


class Sampler(threading.Thread):
    """Runs one source and posts what it says; a daemon thread, so a hung driver never
    keeps the program from exiting."""

    def __init__(self, app: App[int], number: int, source: Source, interval_s: float) -> None:
        super().__init__(name=f"gpuwatch-tui-sampler-{number}", daemon=True)
        self._app, self._number, self._source = app, number, source
        self._interval_s = interval_s
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            backfill = self._source.backfill()
        except Exception as error:  # the past is a nicety; the present matters
            backfill = Backfill(self._source.label, note=f"no history ({error})")
        self._app.post_message(BackfillArrived(self._number, backfill))
        for frame in self._source.frames(self._interval_s, self.stop):
            if self.stop.is_set():
                return
            self._app.post_message(FrameArrived(self._number, frame))
