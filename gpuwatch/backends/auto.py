"""The `auto` backend: the daemon's snapshots, and the driver's while the daemon is away.

A daemon restarts (an upgrade, a crash and systemd) or hangs (a stopped
process): a job waiting for GPUs, or a watch, must outlive that. A sample the
daemon cannot give is read from the driver instead, opened on first need, and
the daemon is asked again a few seconds later. Where there is no driver to
read either, or the daemon serves a simulated node (whose stand-in the driver's real
GPUs must never be), `sample()` raises `DaemonUnavailableError`, and the caller decides
whether to try again (a waiting pick does, until its own timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import BackendError, DaemonUnavailableError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Snapshot

RETRY_DAEMON_S = 5.0
"""How long the driver serves, once the daemon failed, before the daemon is asked again."""


class AutoBackend(Backend):
    """The daemon at `daemon.socket_path`, standing in the driver for a sample it cannot give."""

    def __init__(
        self,
        daemon: Backend,
        open_driver: Callable[[], Backend],
        *,
        on_lost: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._daemon = daemon
        self._open_driver = open_driver
        self._on_lost = on_lost
        self._clock = clock
        self._driver: Backend | None = None
        self._daemon_again_at: float | None = None
        """While the driver stands in: when to ask the daemon again."""
        self.socket_path: str | None = getattr(daemon, "socket_path", None)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._daemon.name if self._driver is None else self._driver.name

    @property
    def simulation(self) -> str | None:  # type: ignore[override]
        return self._daemon.simulation

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        again_at = self._daemon_again_at
        if again_at is None or self._clock() >= again_at:
            try:
                snapshot = self._daemon.sample(scope)
            except DaemonUnavailableError as error:
                return self._from_driver(scope, error, told=again_at is not None)
            self._daemon_again_at = None
            return snapshot
        return self._from_driver(scope, None, told=True)

    def recent_utilization_pct(self, window_s: float) -> dict[str, float]:
        if self._daemon_again_at is not None:
            return {}  # the driver stands in, and keeps no history
        return self._daemon.recent_utilization_pct(window_s)

    def history(self, window_s: float) -> list[GpuSeries] | None:
        if self._daemon_again_at is not None:
            return None  # the driver stands in, and keeps no history
        return self._daemon.history(window_s)

    def _from_driver(
        self, scope: SampleScope, lost: DaemonUnavailableError | None, *, told: bool
    ) -> Snapshot:
        if self.simulation is not None:  # its jobs lease made-up GPUs, apart from real ones
            raise DaemonUnavailableError(
                f"{lost or 'the daemon is away'}; it serves a simulated node, for which the "
                "driver never stands in"
            )
        try:
            if self._driver is None:
                self._driver = self._open_driver()
            snapshot = self._driver.sample(scope)
        except BackendError as error:
            self._daemon_again_at = None  # nothing else to read: the daemon again, next time
            raise DaemonUnavailableError(f"{lost or 'the daemon is away'}; and {error}") from error
        if lost is not None:
            self._daemon_again_at = self._clock() + RETRY_DAEMON_S
            if not told and self._on_lost is not None:
                self._on_lost(f"lost the daemon ({lost}); reading the driver until it is back")
        return snapshot

    def close(self) -> None:
        self._daemon.close()
        if self._driver is not None:
            self._driver.close()
