"""The daemon's read-only HTTP API, served on its Unix socket.

    GET /v1/snapshot               the latest snapshot (the JSON of `gpuwatch status --json`)
    GET /v1/history?last=10m       per-GPU series of memory, utilization, temperature and
    GET /v1/history?since=UNIX         power (default: the last 10 minutes; at most
                                       20,000 samples, the newest, and `truncated` says so)
    GET /v1/leases                 who holds which GPU (from the lease directory)
    GET /v1/health                 whether sampling works, and how big the history is
    GET /metrics                   Prometheus metrics

Anything else is 404, and every method but GET and HEAD is 405: nothing here
changes state. The socket is open to every local user, so no client can hold
the daemon up: a connection idle for 5 s is closed, at most 128 are served at
once, and at most 2 history answers are built at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import socket
import socketserver
import stat
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gpuwatch._version import __version__
from gpuwatch.daemon.settings import Settings
from gpuwatch.errors import DaemonError, InvalidValueError
from gpuwatch.leases import LeaseDir, LeaseFiles
from gpuwatch.models import Lease
from gpuwatch.sampling import Poller
from gpuwatch.units import parse_duration

log = logging.getLogger("gpuwatch.daemon")

DEFAULT_HISTORY_WINDOW_S = 600.0
MAX_HISTORY_POINTS = 20_000
MAX_CONNECTIONS = 128
IDLE_TIMEOUT_S = 5.0
_JSON = "application/json"
_BUSY_BODY = b'{"error": "too many clients at once; ask again"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes


def _json(status: int, data: object) -> Response:
    return Response(status, _JSON, json.dumps(data).encode())


class Api:
    """Answers each route from the poller's state; no HTTP in here, so it is tested directly."""

    def __init__(self, poller: Poller, settings: Settings, registry: CollectorRegistry) -> None:
        self.poller = poller
        self.settings = settings
        self._registry = registry
        self._started = time.monotonic()
        self._snapshot_cache: tuple[int, Response] | None = None
        self._cache_lock = threading.Lock()
        self._history_slots = threading.BoundedSemaphore(2)

    def route(self, method: str, target: str) -> Response:
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} is not allowed: this API only reads"})
        url = urlsplit(target)
        routes = {
            "/v1/snapshot": self.snapshot,
            "/v1/leases": self.leases,
            "/v1/health": self.health,
            "/metrics": self.metrics,
        }
        if url.path == "/v1/history":
            return self.history({key: values[-1] for key, values in parse_qs(url.query).items()})
        if (answer := routes.get(url.path.rstrip("/") or "/")) is not None:
            return answer()
        return _json(404, {"error": f"no such path: {url.path}", "paths": [*routes, "/v1/history"]})

    def snapshot(self) -> Response:
        state = self.poller.state
        if (stalled_s := self.poller.stalled_s) is not None:
            return _json(
                503,
                {
                    "error": f"sampling has made no progress for {stalled_s:.0f}s "
                    "(a driver call hangs?)"
                },
            )
        if state.snapshot is None:
            return _json(503, {"error": "no snapshot yet", "last_error": state.error})
        with self._cache_lock:  # 50 clients polling at 10 Hz share one encoding per sample
            if self._snapshot_cache is None or self._snapshot_cache[0] != state.samples:
                self._snapshot_cache = (state.samples, _json(200, state.snapshot.to_dict()))
            return self._snapshot_cache[1]

    def history(self, query: dict[str, str]) -> Response:
        try:
            if "since" in query:
                start = float(query["since"])
            else:
                start = time.time() - parse_duration(query.get("last", "600"))
        except (ValueError, InvalidValueError):
            return _json(400, {"error": "give since=UNIX_TIME or last=DURATION (e.g. 10m)"})
        if not self._history_slots.acquire(blocking=False):
            return _json(503, {"error": "two history answers are being built; ask again"})
        try:
            series, truncated = self.poller.history_since(start, MAX_HISTORY_POINTS)
            return _json(
                200,
                {
                    "interval_s": self.poller.interval_s,
                    "truncated": truncated,
                    "gpus": [dataclasses.asdict(s) for s in series],
                },
            )
        finally:
            self._history_slots.release()

    def leases(self) -> Response:
        found = self._lease_files()
        return _json(
            200,
            {"leases": [lease.to_dict() for lease in found.leases], "skipped": found.skipped},
        )

    def health(self) -> Response:
        state = self.poller.state
        held, capacity, nbytes = self.poller.history_size()
        snapshot = state.snapshot
        faulty = [gpu.index for gpu in snapshot.gpus if not gpu.ok] if snapshot else []
        stalled_s = self.poller.stalled_s
        if stalled_s is not None:
            status = "stalled"
        elif snapshot is None:
            status = "starting" if state.error is None else "failing"
        else:
            status = "degraded" if state.error or faulty else "ok"
        serving = snapshot is not None and stalled_s is None
        return _json(
            200 if serving else 503,
            {
                "status": status,
                "version": __version__,
                "pid": os.getpid(),
                "backend": "sim" if self.settings.sim else self.settings.backend,
                "interval_s": self.poller.interval_s,
                "uptime_s": round(time.monotonic() - self._started, 1),
                "samples": state.samples,
                "last_attempt_age_s": round(time.monotonic() - state.attempted_at, 3),
                "last_error": state.error,
                "gpus": len(snapshot.gpus) if snapshot else 0,
                "gpus_with_errors": faulty,
                "history": {
                    "samples": held,
                    "capacity": capacity,
                    "bytes": nbytes,
                    "retention_s": self.poller.history_s,
                },
            },
        )

    def metrics(self) -> Response:
        return Response(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))

    def current_leases(self) -> list[Lease]:
        return self._lease_files().leases

    def _lease_files(self) -> LeaseFiles:
        lease_dir = LeaseDir.read_only()
        return lease_dir.read() if lease_dir is not None else LeaseFiles([])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"gpuwatch/{__version__}"
    timeout = IDLE_TIMEOUT_S  # a client that connects and sends nothing is let go

    def do_GET(self) -> None:
        self._answer(self._route(), body=True)

    def do_HEAD(self) -> None:
        self._answer(self._route(), body=False)

    def _refuse(self) -> None:
        self._answer(self._route(), body=True)

    def _route(self) -> Response:
        assert isinstance(self.server, _Guarded)
        response: Response = self.server.answer(self.command, self.path)
        return response

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    def _answer(self, response: Response, *, body: bool) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if body:
            self.wfile.write(response.body)

    def address_string(self) -> str:
        return "local" if isinstance(self.client_address, str) else str(self.client_address[0])

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would flood the journal at 10 Hz per client


class _Guarded(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """A threading server that no client can exhaust: connections beyond the cap are closed."""

    daemon_threads = True
    request_queue_size = 256  # clients arrive in bursts; the default of 5 refuses them

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):  # a word for the client, without waiting on it
                request.settimeout(0.1)
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                time.sleep(0.1)  # out of descriptors: do not spin on the waiting connection
            raise


class UnixApiServer(_Guarded, socketserver.UnixStreamServer):
    """The API on a Unix socket that every local user may connect to."""

    def __init__(self, path: str, api: Api) -> None:
        _Guarded.__init__(self, api.route)
        _clear_stale_socket(path)
        try:
            socketserver.UnixStreamServer.__init__(self, path, _Handler)
        except OSError as error:
            raise DaemonError(f"cannot listen on {path}: {error.strerror}") from error
        os.chmod(path, 0o666)  # reading the API is for everyone; nothing in it writes


class TcpMetricsServer(_Guarded, socketserver.TCPServer):
    """`/metrics` alone, over TCP (`--listen`); the rest of the API stays on the machine."""

    allow_reuse_address = True

    def __init__(self, host: str, port: int, api: Api) -> None:
        _Guarded.__init__(self, self._metrics_only)
        self._api = api
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socketserver.TCPServer.__init__(self, (host, port), _Handler)
        except OSError as error:
            raise DaemonError(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error

    def _metrics_only(self, method: str, target: str) -> Response:
        if urlsplit(target).path != "/metrics":
            return _json(404, {"error": "only /metrics is served over TCP"})
        return self._api.route(method, "/metrics")


def _clear_stale_socket(path: str) -> None:
    """Removes a socket left by a dead daemon, or planted by someone else; refuses to
    disturb a live daemon of this user."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise DaemonError(f"{path} exists and is not a socket; remove it or pass --socket")
    if info.st_uid == os.getuid():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                pass
            else:
                raise DaemonError(f"another gpuwatch daemon is serving {path}; stop it first")
    else:
        log.warning(
            "removing %s, a socket of uid %d that clients would take for this daemon",
            path,
            info.st_uid,
        )
    try:
        os.unlink(path)
    except OSError as error:
        raise DaemonError(
            f"cannot remove {path}, which another user made: {error.strerror}; pass --socket"
        ) from error
