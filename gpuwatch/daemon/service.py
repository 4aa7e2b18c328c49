"""The daemon's life: start, serve, reload on SIGHUP, stop cleanly on SIGTERM.

Threads: the poller samples; the API server answers, one thread per
connection; the main thread only waits for signals and keeps systemd's
watchdog fed while sampling makes progress.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import time
from types import FrameType

from gpuwatch.backends import open_backend
from gpuwatch.backends.base import Backend
from gpuwatch.daemon.api import Api, UnixApiServer
from gpuwatch.daemon.metrics import registry_for
from gpuwatch.daemon.notify import Notifier
from gpuwatch.daemon.settings import Settings, with_config_file
from gpuwatch.errors import DaemonError
from gpuwatch.models import Lease, Snapshot
from gpuwatch.sampling import Poller

log = logging.getLogger("gpuwatch.daemon")

STUCK_AFTER_S = 60.0
"""A sampling attempt that has not finished after this long (a driver call hung) stops
the watchdog pings, so that systemd restarts the daemon."""


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = with_config_file(settings)
        self.poller = Poller(self._open_source, self.settings.interval_s, self.settings.history_s)
        self.notifier = Notifier.from_environment()
        self.registry = registry_for(self._metrics_source)
        self.api = Api(self.poller, self.settings, self.registry)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()  # set by signals, so the main loop acts at once
        self._tcp: object | None = None

    def run(self) -> int:
        server = UnixApiServer(self.settings.socket_path, self.api)
        try:
            self._serve_tcp(self.settings)  # every listener is bound before any answers
            self.poller.start()
            threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.5},
                name="gpuwatch-api",
                daemon=True,
            ).start()
            self._install_signal_handlers()
            log.info(
                "serving %s every %gs on %s%s",
                self.settings.backend if not self.settings.sim else "sim",
                self.settings.interval_s,
                self.settings.socket_path,
                _listen_note(self.settings),
            )
            # Everything made so far lives as long as the daemon: keep the collector from
            # walking it again and again (a cost that would dwarf each second's sampling).
            gc.freeze()
            self.notifier.ready(self._status_line())
            self._main_loop()
        finally:
            self.notifier.stopping()
            server.shutdown()
            server.server_close()
            with contextlib.suppress(OSError):
                os.unlink(self.settings.socket_path)
            self._stop_tcp()
            self.poller.stop()
        log.info("stopped")
        return 0

    def _main_loop(self) -> None:
        beat_s = self.notifier.watchdog_interval_s or 1.0
        while not self._stop.is_set():
            self._wake.wait(beat_s)
            self._wake.clear()
            if self._reload.is_set():
                self._reload.clear()
                self._reload_settings()
            state = self.poller.state
            if time.monotonic() - state.attempted_at < max(
                STUCK_AFTER_S, 10 * self.poller.interval_s
            ):
                self.notifier.watchdog()
            self.notifier.status(self._status_line())

    def _reload_settings(self) -> None:
        self.notifier.reloading()
        try:
            fresh = with_config_file(self.settings)
        except DaemonError as error:
            log.error("reload failed, keeping the settings in force: %s", error)
        else:
            self.poller.reconfigure(fresh.interval_s, fresh.history_s)
            if fresh.listen != self.settings.listen:
                self._stop_tcp()
                self._serve_tcp(fresh)
            self.settings = self.api.settings = fresh
            log.info(
                "reloaded: every %gs, %gs of history%s",
                fresh.interval_s,
                fresh.history_s,
                _listen_note(fresh),
            )
        self.poller.reopen()  # picks up a driver that was upgraded, or an edited scenario
        self.notifier.ready(self._status_line())

    def _open_source(self) -> Backend:
        # The daemon is where snapshots come from, so it never asks a daemon for them.
        if self.settings.sim:
            return open_backend("sim", self.settings.sim)
        return open_backend("nvml" if self.settings.backend == "auto" else self.settings.backend)

    def _metrics_source(self) -> tuple[Snapshot | None, list[Lease], bool]:
        state = self.poller.state
        return state.snapshot, self.api.current_leases(), state.error is None

    def _serve_tcp(self, settings: Settings) -> None:
        if settings.listen is None:
            return
        from prometheus_client import start_http_server

        host, port = settings.listen
        try:
            self._tcp, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise DaemonError(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error

    def _stop_tcp(self) -> None:
        if self._tcp is not None:
            self._tcp.shutdown()  # type: ignore[attr-defined]
            self._tcp.server_close()  # type: ignore[attr-defined]
            self._tcp = None

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            self._stop.set()
            self._wake.set()

        def reload(signum: int, frame: FrameType | None) -> None:
            self._reload.set()
            self._wake.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def _status_line(self) -> str:
        state = self.poller.state
        if state.snapshot is None:
            return f"waiting for the first sample ({state.error or 'starting'})"
        faulty = sum(not gpu.ok for gpu in state.snapshot.gpus)
        note = f", {faulty} with faults" if faulty else ""
        return f"{len(state.snapshot.gpus)} GPUs{note}, {state.samples} samples"


def run_daemon(settings: Settings) -> int:
    return Daemon(settings).run()


def _listen_note(settings: Settings) -> str:
    if settings.listen is None:
        return ""
    host, port = settings.listen
    return f", metrics also on http://{host}:{port}/metrics"
