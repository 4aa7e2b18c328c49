"""The daemon's read-only HTTP API, served on its Unix socket.

    GET /v1/snapshot               the latest snapshot (the JSON of `gpuwatch status --json`)
    GET /v1/history?last=10m       per-GPU series of memory, utilization, temperature and
    GET /v1/history?since=UNIX         power (default: the last 10 minutes)
    GET /v1/leases                 who holds which GPU (from the lease directory)
    GET /v1/health                 whether sampling works, and how big the history is
    GET /metrics                   Prometheus metrics

Anything else is 404, and every method but GET and HEAD is 405: nothing here
changes state. The socket is open to every local user for reading.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import socketserver
import stat
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from gpuwatch._version import __version__
from gpuwatch.daemon.settings import Settings
from gpuwatch.errors import DaemonError, InvalidValueError
from gpuwatch.leases import LeaseDir
from gpuwatch.models import Lease
from gpuwatch.sampling import Poller
from gpuwatch.units import parse_duration

DEFAULT_HISTORY_WINDOW_S = 600.0
_JSON = "application/json"


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

    def route(self, method: str, target: str) -> Response:
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} is not allowed: this API only reads"})
        url = urlsplit(target)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        routes = {
            "/v1/snapshot": self.snapshot,
            "/v1/leases": self.leases,
            "/v1/health": self.health,
            "/metrics": self.metrics,
        }
        if url.path == "/v1/history":
            return self.history(query)
        if (answer := routes.get(url.path.rstrip("/") or "/")) is not None:
            return answer()
        return _json(404, {"error": f"no such path: {url.path}", "paths": [*routes, "/v1/history"]})

    def snapshot(self) -> Response:
        state = self.poller.state
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
        series = self.poller.history_since(start)
        return _json(
            200,
            {"interval_s": self.poller.interval_s, "gpus": [dataclasses.asdict(s) for s in series]},
        )

    def leases(self) -> Response:
        return _json(200, {"leases": [lease.to_dict() for lease in self.current_leases()]})

    def health(self) -> Response:
        state = self.poller.state
        held, capacity, nbytes = self.poller.history_size()
        faulty = [gpu.index for gpu in state.snapshot.gpus if not gpu.ok] if state.snapshot else []
        if state.snapshot is None:
            status = "starting" if state.error is None else "failing"
        else:
            status = "degraded" if state.error or faulty else "ok"
        return _json(
            200 if state.snapshot is not None else 503,
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
                "gpus": len(state.snapshot.gpus) if state.snapshot else 0,
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
        lease_dir = LeaseDir.read_only()
        return lease_dir.leases() if lease_dir is not None else []


class _Handler(BaseHTTPRequestHandler):
    server: UnixApiServer
    protocol_version = "HTTP/1.1"
    server_version = f"gpuwatch/{__version__}"

    def do_GET(self) -> None:
        self._answer(self.server.api.route("GET", self.path), body=True)

    def do_HEAD(self) -> None:
        self._answer(self.server.api.route("HEAD", self.path), body=False)

    def _refuse(self) -> None:
        self._answer(self.server.api.route(self.command, self.path), body=True)

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

    def _answer(self, response: Response, *, body: bool) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if body:
            self.wfile.write(response.body)

    def address_string(self) -> str:
        return "local"  # a Unix socket has no peer address

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would flood the journal at 10 Hz per client


class UnixApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves the API on a Unix socket that every local user may connect to."""

    daemon_threads = True
    request_queue_size = 256  # clients arrive in bursts; the default of 5 refuses them

    def __init__(self, path: str, api: Api) -> None:
        self.api = api
        _clear_stale_socket(path)
        try:
            super().__init__(path, _Handler)
        except OSError as error:
            raise DaemonError(f"cannot listen on {path}: {error.strerror}") from error
        os.chmod(path, 0o666)  # reading the API is for everyone; nothing in it writes


def _clear_stale_socket(path: str) -> None:
    """Removes a socket left by a daemon that died; refuses to disturb a live one."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise DaemonError(f"{path} exists and is not a socket; remove it or pass --socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
            return
    raise DaemonError(f"another gpuwatch daemon is serving {path}; stop it first")
