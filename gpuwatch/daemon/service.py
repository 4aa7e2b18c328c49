"""The daemon's life: start, serve, reload on SIGHUP, stop cleanly on SIGTERM.

Threads: the poller samples; one thread asks the scheduler which job holds
each GPU (`job_watch`); the API servers answer, one thread per connection.
The main thread takes signals synchronously (they are blocked in every thread
and waited for with `sigtimedwait`, so no handler ever runs in the middle of
other code), tells systemd READY once the first attempt to sample has
finished, and keeps systemd's watchdog fed while sampling makes progress.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import signal
import threading
import time

from gpuwatch.backends import open_backend
from gpuwatch.backends.base import Backend
from gpuwatch.daemon.api import Api, stale_reason
from gpuwatch.daemon.job_watch import JobSettings, JobWatch
from gpuwatch.daemon.listeners import TcpMetricsServer, UnixApiServer
from gpuwatch.daemon.node import NamedNode
from gpuwatch.daemon.notify import Notifier
from gpuwatch.daemon.settings import Settings, with_config_file
from gpuwatch.daemon.webconfig import WebConfig, keep_learnt, load_web_config, weakening
from gpuwatch.errors import ConfigFileError
from gpuwatch.paths import socket_candidates
from gpuwatch.sampling.poller import Poller
from gpuwatch.units import counted

log = logging.getLogger("gpuwatch.daemon")

STUCK_AFTER_S = 60.0
"""A sampling attempt that has not finished after this long (a driver call hung) stops
the watchdog pings, so that systemd restarts the daemon."""
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_SIGNALS = {*_STOP_SIGNALS, signal.SIGHUP}
_FIRST_SAMPLE_POLL_S = 0.02


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self._flags = settings  # what the command line said; the config file goes on top
        self.settings = with_config_file(settings)
        self.web = _web_config(self.settings)  # a bad file stops the start before any work
        self.jobs = JobWatch(job_settings(self.settings))
        self.poller = Poller(
            self._open_source,
            self.settings.interval_s,
            self.settings.history_s,
            after_sample=self.jobs.after_sample,
        )
        self.notifier = Notifier.from_environment()
        self.api = Api(self.poller, self.settings, self.jobs)
        self._tcp: TcpMetricsServer | None = None

    def run(self) -> int:
        _raise_open_file_limit()
        # Blocked before any thread starts, so all inherit it; restored whatever happens.
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            self._serve()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        log.info("stopped")
        return 0

    def _serve(self) -> None:
        server = UnixApiServer(self.settings.socket_path, self.api.route)
        serving = False
        try:
            # every listener bound before any answers
            self._tcp = self._bind_tcp(self.settings, self.web)
            self.poller.start()
            self.jobs.start()
            _serve_in_thread(server, "gpuwatch-api")
            serving = True
            log.info(
                "serving %s every %gs on %s%s%s, %s",
                self._source_name(),
                self.settings.interval_s,
                self.settings.socket_path,
                _clients_note(self.settings.socket_path),
                _listen_note(self.settings, self.web),
                self.jobs.describe(),
            )
            # Everything made so far lives as long as the daemon: keep the collector from
            # walking it again and again (a cost that would dwarf each second's sampling).
            gc.freeze()
            if self._first_attempt():
                self.notifier.ready(self._status_line())
                self._main_loop()
        finally:
            self.notifier.stopping()
            if serving:
                server.shutdown()
            server.server_close()
            self._close_tcp(self._tcp)
            self.jobs.stop()
            self.poller.stop()

    def _first_attempt(self) -> bool:
        """Waits for the first attempt to sample, so that READY means a snapshot (or a
        failure, reported as down) is there to serve; False when told to stop first."""
        while not self.poller.state.attempted:
            if _signal_number(_STOP_SIGNALS, _FIRST_SAMPLE_POLL_S) is not None:
                return False
        return True

    def _main_loop(self) -> None:
        beat_s = self.notifier.watchdog_interval_s or 1.0
        while True:
            received = _signal_number(_SIGNALS, beat_s)
            if received in _STOP_SIGNALS:
                return
            if received == signal.SIGHUP:
                self._reload_settings()
            if time.monotonic() - self.poller.state.attempted_at < max(
                STUCK_AFTER_S, 10 * self.poller.interval_s
            ):
                self.notifier.watchdog()
            self.notifier.status(self._status_line())

    def _reload_settings(self) -> None:
        self.notifier.reloading()
        try:
            fresh = with_config_file(self._flags)
            web = _web_config(fresh)  # read again: new certificates, new passwords
            self._refuse_weaker(fresh, web)
            keep_learnt(self.web, web)  # a scraper's verified password is not asked again
            if fresh.listen != self.settings.listen:
                tcp = self._bind_tcp(fresh, web)  # the old listener stays until the new one binds
                self._close_tcp(self._tcp)
                self._tcp = tcp
            elif self._tcp is not None:
                self._tcp.web = web
            self.poller.reconfigure(fresh.interval_s, fresh.history_s)
            self.jobs.reconfigure(job_settings(fresh))
        except Exception as error:  # a reload must never take the daemon down
            log.error("reload failed, keeping the settings in force: %s", error)
        else:
            self.settings = self.api.settings = fresh
            self.web = web
            log.info(
                "reloaded: every %gs, %gs of history%s",
                fresh.interval_s,
                fresh.history_s,
                _listen_note(fresh, web),
            )
        self.poller.reopen()  # picks up a driver that was upgraded, or an edited scenario
        self.notifier.ready(self._status_line())

    def _refuse_weaker(self, fresh: Settings, web: WebConfig | None) -> None:
        """A reload never lowers the TCP listener's guard: a web config truncated or
        dropped from the config file by accident must not serve /metrics to anyone."""
        if self.settings.listen is None or fresh.listen is None:
            return
        if (why := weakening(self.web, web)) is not None:
            where = fresh.web_config_path or f"no web config (none in {fresh.config_path})"
            raise ConfigFileError(
                f"{where}: {why}, so the reload is refused; restart the daemon to do that on "
                "purpose"
            )

    def _open_source(self) -> Backend:
        # The daemon is where snapshots come from, so it never asks a daemon for them.
        if self.settings.sim is not None:  # `--sim ''` is refused there, never the driver
            source = open_backend("sim", self.settings.sim)
        else:
            backend = self.settings.backend
            source = open_backend("nvml" if backend == "auto" else backend)
        node_name = self.settings.node_name
        return source if node_name is None else NamedNode(source, node_name)

    def _source_name(self) -> str:
        return "a simulated node" if self.settings.sim is not None else "the NVIDIA driver"

    def _bind_tcp(self, settings: Settings, web: WebConfig | None) -> TcpMetricsServer | None:
        if settings.listen is None:
            return None
        tcp = TcpMetricsServer(*settings.listen, self.api.metrics_only, web)
        _serve_in_thread(tcp, "gpuwatch-metrics")
        return tcp

    @staticmethod
    def _close_tcp(tcp: TcpMetricsServer | None) -> None:
        if tcp is not None:
            tcp.shutdown()
            tcp.server_close()

    def _status_line(self) -> str:
        state = self.poller.state
        if (stale := stale_reason(self.poller)) is not None:
            return stale
        if state.snapshot is None:
            return f"waiting for the first sample ({state.error or 'starting'})"
        faulty = sum(not gpu.ok for gpu in state.snapshot.gpus)
        note = f", {faulty} with faults" if faulty else ""
        gpus = counted(len(state.snapshot.gpus), "GPU")
        return f"{gpus}{note}, {counted(state.samples, 'sample')}"


def job_settings(settings: Settings) -> JobSettings:
    return JobSettings(
        settings.jobs,
        settings.jobs_refresh_s,
        settings.idle_window_s,
        settings.slurm_conf,
        node_name=settings.node_name,
        keep_s=settings.history_s,
        pod_resources_socket=settings.pod_resources_socket,
    )


def _signal_number(signals: set[signal.Signals], timeout_s: float) -> int | None:
    """The signal of `signals` that came within `timeout_s`, or `None`.

    A daemon stopped and continued (SIGSTOP, SIGCONT: a debugger, `kill -STOP`) can see
    `sigtimedwait` return a siginfo it never filled in: any number but those asked for
    is no signal, never a reason to reload or to stop.
    """
    received = signal.sigtimedwait(signals, timeout_s)
    if received is None or received.si_signo not in signals:
        return None
    return received.si_signo


def run_daemon(settings: Settings) -> int:
    return Daemon(settings).run()


def _serve_in_thread(server: UnixApiServer | TcpMetricsServer, name: str) -> None:
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, name=name, daemon=True
    ).start()


def _raise_open_file_limit() -> None:
    """Up to the hard limit: each client connection is a descriptor."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _clients_note(socket_path: str) -> str:
    """How clients find a socket where they do not look by themselves."""
    if socket_path in socket_candidates():
        return ""
    return f" (clients find it with GPUWATCH_SOCKET={socket_path})"


def _web_config(settings: Settings) -> WebConfig | None:
    if settings.web_config_path is None:
        return None
    return load_web_config(settings.web_config_path)


def _listen_note(settings: Settings, web: WebConfig | None) -> str:
    if settings.listen is None:
        return ""
    host, port = settings.listen
    scheme = "http" if web is None else web.scheme
    name = f"[{host}]" if ":" in host else host
    auth = " (basic auth)" if web is not None and web.auth is not None else ""
    return f", metrics also on {scheme}://{name}:{port}/metrics{auth}"
