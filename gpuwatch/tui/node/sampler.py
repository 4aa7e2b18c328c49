"""The sampling threads: each runs one source and hands what it says to the app.

Threads never touch widgets: a sampler hands each frame (and, once, first, the source's
past) to callbacks that post a message to the app, which applies it on its own thread.
A sampler is a daemon thread, so a hung driver never keeps the program from exiting.
Nothing here imports Textual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpuwatch.tui.common.frames import Backfill, Frame
from gpuwatch.tui.node.sources import Source

SAMPLER_EXIT_WAIT_S = 2.0
"""How long the app waits, on exit, for samplers to finish their current read."""


class Sampler(threading.Thread):
    """Runs source `number` and hands on what it says: its past once, then every frame."""

    def __init__(
        self,
        number: int,
        source: Source,
        interval_s: float,
        *,
        on_backfill: Callable[[int, Backfill], object],
        on_frame: Callable[[int, Frame], object],
    ) -> None:
        super().__init__(name=f"gpuwatch-tui-sampler-{number}", daemon=True)
        self._number, self._source = number, source
        self._interval_s = interval_s
        self._on_backfill, self._on_frame = on_backfill, on_frame
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            backfill = self._source.backfill()
        except Exception as error:  # the past is a nicety; the present matters
            backfill = Backfill(self._source.label, note=f"no history ({error})")
        self._on_backfill(self._number, backfill)
        for frame in self._source.frames(self._interval_s, self.stop):
            if self.stop.is_set():
                return
            self._on_frame(self._number, frame)
