"""The daemon's listeners: the API on a Unix socket, `/metrics` over TCP.

Every local user may connect, so no client can lock the others out: each
connection must shake hands and send its first request whole within
`FIRST_REQUEST_S` of arriving, and each later request within `wire`'s
deadline; the slots are shared fairly (`connection_pool`: a cap per client,
the idlest connection closed when a newcomer needs room); over TCP, passwords
cost the guesser, not the daemon (`basic_auth`). A client that goes away early
costs one debug line.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import ipaddress
import itertools
import logging
import os
import random
import select
import socket
import socketserver
import ssl
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from gpuwatch.daemon.basic_auth import CHALLENGE, PasswordChecker
from gpuwatch.daemon.connection_pool import ConnectionPool, Slot
from gpuwatch.daemon.webconfig import WebConfig
from gpuwatch.daemon.wire import (
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

FIRST_REQUEST_S = 3.0
"""A new connection must shake hands (TLS) and send its first request whole within this long:
one that sits idle holds a slot no longer."""
HOLD_S = 2.0
"""How long a new connection from a source that spent its budget of wrong passwords waits,
without a thread or a slot, before it is served (429 to another guess, or the metrics to a
password verified before): answered at once, a guesser would be back at once, each time
costing the daemon a TLS handshake as dear as its own. Each waits between half and one and a
half times as long, so that a crowd let go together does not come back together."""
MAX_HELD = 256
"""Connections held at most; beyond, a spent source's new connections are closed at once."""
Answer = Callable[[str, str], Response]
"""(method, target) -> response."""
_BUSY = encode(
    error_response(503, "too many connections at once; ask again"),
    with_body=True,
    keep_alive=False,
)


class _Guarded(socketserver.BaseServer):
    """A server with a thread per connection that no client can exhaust: connections
    beyond the pool's caps are answered 503 and closed at once."""

    request_queue_size = 256  # clients arrive in bursts; the default of 5 refuses them

    def __init__(self, answer: Answer, thread_name: str) -> None:
        self.answer = answer
        self.pool = ConnectionPool()
        self._thread_name = thread_name

    def client_name(self, request: socket.socket) -> str:
        raise NotImplementedError

    def wrap(self, request: socket.socket) -> socket.socket:
        """The socket to speak HTTP on (TLS's over TCP, which takes `request`'s descriptor)."""
        return request

    def shake_hands(self, connection: socket.socket, deadline: float) -> None:
        """Makes `connection` ready by `deadline` (TLS's handshake); raises OSError if not."""

    def respond(self, request: Request, client: str) -> Response:
        return self.answer(request.method, request.target)

    def process_request(self, request: Any, client_address: Any) -> None:
        deadline = time.monotonic() + FIRST_REQUEST_S
        try:
            client = self.client_name(request)
        except OSError:  # gone before it could be named
            self.shutdown_request(request)
            return
        slot = self.pool.take(client, request)
        if slot is None:
            self._refuse(request)
            return
        try:
            threading.Thread(
                target=self._serve,
                args=(request, slot, deadline),
                daemon=True,
                name=self._thread_name,
            ).start()
        except RuntimeError:  # no thread to spare
            self.pool.give_back(slot)
            self._refuse(request)

    def _serve(self, request: socket.socket, slot: Slot, deadline: float) -> None:
        connection = request
        try:
            connection = self.wrap(request)
            self.shake_hands(connection, deadline)
            self._converse(Connection(connection), slot, deadline)
        except OSError as error:  # a handshake refused or cut short: the client's loss
            log.debug("client %s: %s", slot.client, error)
        except Exception:  # a fault of the daemon's own, not of the client: worth a trace
            log.exception("answering %s failed", slot.client)
        finally:
            self.pool.give_back(slot)  # before the descriptor is closed: see give_back
            if connection is not request:
                connection.close()
            self.shutdown_request(request)

    def _converse(self, connection: Connection, slot: Slot, deadline: float | None) -> None:
        """Answers one connection's requests in turn, the first by `deadline`."""
        try:
            while (request := connection.read_request(deadline)) is not None:
                if not self.pool.answering(slot):
                    return  # closed to make room for a newcomer
                response = self.respond(request, slot.client)
                # A client told to wait (429) is let go: it must come back through the caps.
                keep_alive = request.keep_alive and response.status != 429
                connection.send(response, with_body=request.method != "HEAD", keep_alive=keep_alive)
                if not keep_alive:
                    return
                self.pool.waiting(slot)
                deadline = None
        except BadRequest as error:
            with contextlib.suppress(OSError):
                connection.send(error.response, with_body=True, keep_alive=False)
            log.debug("client %s: %s", slot.client, error)
        except OSError as error:  # gone, or too slow to take its answer: its own loss
            log.debug("client %s: %s", slot.client, error)

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
        _Guarded.__init__(self, answer, "gpuwatch-api-client")
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
    handshake is made on the connection's own thread, under its first request's deadline,
    so that a client slow to shake hands delays nobody else."""

    allow_reuse_address = True

    def __init__(self, host: str, port: int, answer: Answer, web: WebConfig | None) -> None:
        _Guarded.__init__(self, answer, "gpuwatch-tcp-client")
        self.web = web
        """Swapped whole on SIGHUP: a connection keeps the TLS it shook hands with, and each
        request is checked against the passwords in force when it arrives."""
        self.checker = PasswordChecker()
        """Kept across reloads: a new web config hands out no new budgets."""
        self._held: list[tuple[float, int, socket.socket, Any]] = []
        """A heap of (when to serve, arrival number, connection, address)."""
        self._arrivals = itertools.count()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socketserver.TCPServer.__init__(self, (host, port), socketserver.BaseRequestHandler)
        except OSError as error:
            raise DaemonError(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error

    def client_name(self, request: socket.socket) -> str:
        return source_name(str(request.getpeername()[0]))

    @property
    def held(self) -> int:
        """How many new connections wait, unanswered, for their source's turn (`HOLD_S`)."""
        return len(self._held)

    def process_request(self, request: Any, client_address: Any) -> None:
        web = self.web
        source = source_name(str(client_address[0]))
        if web is None or web.auth is None or not self.checker.spent(source):
            super().process_request(request, client_address)
        elif len(self._held) < MAX_HELD:
            due = time.monotonic() + HOLD_S * random.uniform(0.5, 1.5)
            heapq.heappush(self._held, (due, next(self._arrivals), request, client_address))
        else:
            self.shutdown_request(request)

    def service_actions(self) -> None:
        """Serves the held connections whose wait is over (after each accept, and at least
        twice a second)."""
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            _, _, request, client_address = heapq.heappop(self._held)
            super().process_request(request, client_address)

    def server_close(self) -> None:
        super().server_close()
        self.checker.close()
        while self._held:
            self.shutdown_request(heapq.heappop(self._held)[2])

    def wrap(self, request: socket.socket) -> socket.socket:
        # TLS writes an answer in records, one write each: without this, the last waits for
        # the client's delayed ACK (40 ms a scrape).
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.web is None or self.web.tls is None:
            return request
        return self.web.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)

    def shake_hands(self, connection: socket.socket, deadline: float) -> None:
        if isinstance(connection, ssl.SSLSocket):
            _shake_hands(connection, deadline)

    def respond(self, request: Request, client: str) -> Response:
        web = self.web
        if web is None:
            return super().respond(request, client)
        response = self._checked(web, request, client)
        return msgspec.structs.replace(response, headers=(*response.headers, *web.headers))

    def _checked(self, web: WebConfig, request: Request, client: str) -> Response:
        """The answer, if the request's password is one of `web`'s; else why not."""
        if web.auth is None:
            return super().respond(request, client)
        verdict = web.auth.check(request.authorization, client, self.checker)
        if verdict.allowed:
            return super().respond(request, client)
        if verdict.retry_after_s is None:
            return error_response(401, verdict.reason, CHALLENGE)
        return error_response(429, verdict.reason, ("Retry-After", str(verdict.retry_after_s)))


def source_name(address: str) -> str:
    """Who a TCP client is, for its caps: its IPv4 address, or its IPv6 /64 (the least a
    network hands one host, which may take any address in it)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


def _shake_hands(connection: ssl.SSLSocket, deadline: float) -> None:
    """The TLS handshake, whole by `deadline` however slowly its bytes come (a timeout on
    the socket would count afresh for each of them)."""
    connection.setblocking(False)
    poll = select.poll()
    while True:
        try:
            connection.do_handshake()
            return
        except ssl.SSLWantReadError:
            poll.register(connection, select.POLLIN)
        except ssl.SSLWantWriteError:
            poll.register(connection, select.POLLOUT)
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0 or not poll.poll(remaining_s * 1000):
            raise TimeoutError("no TLS handshake by the first request's deadline")


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
        raise DaemonError(
            f"another gpuwatch daemon is serving {path}; stop it first, or run this one beside "
            "it with --socket PATH (its clients find it with GPUWATCH_SOCKET=PATH)"
        )
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
