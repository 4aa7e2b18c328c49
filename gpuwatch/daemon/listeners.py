"""The daemon's listeners: the API on a Unix socket, `/metrics` over TCP.

Every local user may connect, so no client can lock the others out: each
request must arrive whole within a few seconds (`wire`), at most 128
connections are served at once, and at most 16 of them for one client (a uid
on the socket, an address over TCP), so that one client's crowd leaves room
for everyone else. A client that goes away early costs one debug line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import socket
import socketserver
import stat
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpuwatch.daemon.basic_auth import CHALLENGE
from gpuwatch.daemon.webconfig import WebConfig
from gpuwatch.daemon.wire import (
    REQUEST_DEADLINE_S,
    BadRequest,
    Connection,
    Request,
    Response,
    encode,
    error_response,
)
from gpuwatch.errors import DaemonError
from gpuwatch.paths import existing

log = logging.getLogger("gpuwatch.daemon")

MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_CLIENT = 16
Answer = Callable[[str, str], Response]
"""(method, target) -> response."""
_BUSY = encode(
    error_response(503, "too many connections at once; ask again"),
    with_body=True,
    keep_alive=False,
)


class _Handler(socketserver.BaseRequestHandler):
    """Answers one connection's requests in turn; `client_address` is the client's name."""

    server: _Guarded

    def handle(self) -> None:
        connection = Connection(self.request)
        try:
            while (request := connection.read_request()) is not None:
                response = self.server.respond(request)
                connection.send(
                    response, with_body=request.method != "HEAD", keep_alive=request.keep_alive
                )
                if not request.keep_alive:
                    return
        except BadRequest as error:
            with contextlib.suppress(OSError):
                connection.send(error.response, with_body=True, keep_alive=False)
            log.debug("client %s: %s", self.client_address, error)
        except OSError as error:  # gone, or too slow to take its answer: its own loss
            log.debug("client %s: %s", self.client_address, error)


class _Guarded(socketserver.BaseServer):
    """A server with a thread per connection that no client can exhaust: connections
    beyond the caps are answered 503 and closed at once."""

    request_queue_size = 256  # clients arrive in bursts; the default of 5 refuses them

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self._lock = threading.Lock()
        self._per_client: Counter[str] = Counter()

    def client_name(self, request: socket.socket) -> str:
        raise NotImplementedError

    def open_connection(self, request: socket.socket) -> socket.socket:
        """The socket to speak HTTP on (TLS's, over TCP); raises OSError when there is none."""
        return request

    def respond(self, request: Request) -> Response:
        return self.answer(request.method, request.target)

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            client = self.client_name(request)
        except OSError:  # gone before it could be named
            self.shutdown_request(request)
            return
        if not self._take_slot(client):
            self._refuse(request)
            return
        try:
            threading.Thread(
                target=self._serve, args=(request, client), daemon=True, name="gpuwatch-client"
            ).start()
        except RuntimeError:  # no thread to spare
            self._give_slot(client)
            self._refuse(request)

    def _serve(self, request: socket.socket, client: str) -> None:
        connection = request
        try:
            connection = self.open_connection(request)
            _Handler(connection, client, self)
        except OSError as error:  # a handshake refused or cut short: the client's loss
            log.debug("client %s: %s", client, error)
        except Exception:  # a fault of the daemon's own, not of the client: worth a trace
            log.exception("answering %s failed", client)
        finally:
            self._give_slot(client)
            if connection is not request:
                connection.close()
            self.shutdown_request(request)

    def _take_slot(self, client: str) -> bool:
        with self._lock:
            total = self._per_client.total()
            if total >= MAX_CONNECTIONS or self._per_client[client] >= MAX_CONNECTIONS_PER_CLIENT:
                return False
            self._per_client[client] += 1
            return True

    def _give_slot(self, client: str) -> None:
        with self._lock:
            self._per_client[client] -= 1
            if self._per_client[client] <= 0:
                del self._per_client[client]

    def _refuse(self, request: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a word for the client, without waiting on it
            request.setblocking(False)
            request.send(_BUSY)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exception()
        if isinstance(error, OSError):  # a client gone while it was accepted or refused
            log.debug("client %s: %s", client_address, error)
        else:
            log.exception("serving a connection failed")

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                time.sleep(0.1)  # out of descriptors: do not spin on the waiting connection
            raise


class UnixApiServer(_Guarded, socketserver.UnixStreamServer):
    """The API on a Unix socket that every local user may connect to."""

    def __init__(self, path: str, answer: Answer) -> None:
        _Guarded.__init__(self, answer)
        self._path = path
        socketserver.UnixStreamServer.__init__(
            self, path, socketserver.BaseRequestHandler, bind_and_activate=False
        )
        try:
            self._inode = _listen_in_place(self.socket, path, self.request_queue_size)
        except BaseException:
            self.socket.close()
            raise

    def client_name(self, request: socket.socket) -> str:
        credentials = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return f"uid {struct.unpack('3i', credentials)[1]}"

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(OSError):  # only our own socket: a successor may have taken it
            if os.lstat(self._path).st_ino == self._inode:
                os.unlink(self._path)


class TcpMetricsServer(_Guarded, socketserver.TCPServer):
    """Over TCP (`--listen`), for Prometheus: HTTPS and basic auth as `web` says. The TLS
    handshake is made on the connection's own thread, under the request deadline, so that
    a client slow to shake hands delays nobody else."""

    allow_reuse_address = True

    def __init__(self, host: str, port: int, answer: Answer, web: WebConfig | None) -> None:
        _Guarded.__init__(self, answer)
        self.web = web
        """Swapped whole on SIGHUP: a connection keeps the TLS it shook hands with, and each
        request is checked against the passwords in force when it arrives."""
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socketserver.TCPServer.__init__(self, (host, port), socketserver.BaseRequestHandler)
        except OSError as error:
            raise DaemonError(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error

    def client_name(self, request: socket.socket) -> str:
        return str(request.getpeername()[0])

    def open_connection(self, request: socket.socket) -> socket.socket:
        # TLS writes an answer in records, one write each: without this, the last waits for
        # the client's delayed ACK (40 ms a scrape).
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.web is None or self.web.tls is None:
            return request
        connection = self.web.tls.wrap_socket(
            request, server_side=True, do_handshake_on_connect=False
        )
        try:
            connection.settimeout(REQUEST_DEADLINE_S)
            connection.do_handshake()
        except BaseException:
            connection.close()
            raise
        return connection

    def respond(self, request: Request) -> Response:
        web = self.web
        if web is None:
            return super().respond(request)
        if web.auth is not None and not web.auth.allows(request.authorization):
            response = error_response(401, "give a user and password of the web config", CHALLENGE)
        else:
            response = super().respond(request)
        return dataclasses.replace(response, headers=(*response.headers, *web.headers))


def _listen_in_place(listener: socket.socket, path: str, backlog: int) -> int:
    """Listens at `path`; returns the socket's inode.

    Only a socket is ever replaced there, and only a stale one (or one another
    user planted in a directory that is the daemon's alone): anything else at
    `path` is refused and left untouched (`existing`), and a socket a daemon
    answers on is refused. The socket is bound under a name nobody can guess,
    then linked at `path` (which fails, replacing nothing, if something came
    there meanwhile) or renamed over the stale socket, so that the path never
    goes missing for a client in between.
    """
    found = existing(path, stat.S_IFSOCK, "--socket")
    if found is not None:
        _refuse_if_served(path, found)
    directory, name = os.path.split(os.path.abspath(path))
    draft = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        listener.bind(draft)
        os.chmod(draft, 0o666)  # reading the API is for everyone; nothing in it writes
        listener.listen(backlog)
        if found is None:
            os.link(draft, path)
        else:
            _rename_over(draft, path, found)
    except FileExistsError:
        raise DaemonError(f"{path} appeared while the daemon started; start it again") from None
    except OSError as error:
        raise DaemonError(
            f"cannot listen on {path}: {error.strerror or error}; pass --socket with a path in a "
            "directory only the daemon may write"
        ) from error
    finally:
        with contextlib.suppress(OSError):
            os.unlink(draft)
    return os.lstat(path).st_ino


def _refuse_if_served(path: str, found: os.stat_result) -> None:
    """Refuses a socket that a daemon answers on, unless another user planted it in a
    directory that is the daemon's alone (where only they could squat the daemon's name)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return  # stale: nobody listens
        except OSError as error:
            raise DaemonError(
                f"cannot tell whether a daemon serves {path} ({error.strerror or error}); "
                "remove it if none does, or give another --socket"
            ) from None
    if found.st_uid in (0, os.geteuid()) or not _own_directory(path):
        raise DaemonError(f"another gpuwatch daemon is serving {path}; stop it first")
    log.warning("replacing the socket at %s, which uid %d planted", path, found.st_uid)


def _own_directory(path: str) -> bool:
    info = os.lstat(os.path.dirname(os.path.abspath(path)))
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _rename_over(draft: str, path: str, found: os.stat_result) -> None:
    """Renames `draft` over the socket `found` at `path`, unless something else came there."""
    now = os.lstat(path)
    if (now.st_ino, now.st_dev) != (found.st_ino, found.st_dev) or not stat.S_ISSOCK(now.st_mode):
        raise FileExistsError(path)
    os.rename(draft, path)
