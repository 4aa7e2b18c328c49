"""A real daemon with a TCP listener, the listener alone in this process, and a client for
them that speaks HTTPS where asked, from any loopback address (127.0.0.2 plays another host)."""

from __future__ import annotations

import base64
import http.client
import os
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatch.daemon.listeners import TcpMetricsServer
from gpuwatch.daemon.webconfig import WebConfig
from gpuwatch.daemon.wire import Response
from tests.helpers.daemon import running_daemon

METRICS = b"gpuwatch_sampling_up 1\n"
"""What the listener alone (`metrics_listener`) answers to everyone it lets in."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: str


def get(
    port: int,
    path: str,
    *,
    tls: ssl.SSLContext | None = None,
    user: str | None = None,
    password: str = "",
    source: str = "127.0.0.1",
) -> Reply:
    """GET `path` from 127.0.0.1:`port` (HTTPS with `tls`), with basic auth as `user` when
    given, on a connection of its own from the loopback address `source`."""
    address = (source, 0)
    if tls is None:
        connection: http.client.HTTPConnection = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=10, source_address=address
        )
    else:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=10, context=tls, source_address=address
        )
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read().decode()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
    finally:
        connection.close()


@dataclass(frozen=True)
class TcpDaemon:
    process: subprocess.Popen[str]
    socket_path: Path
    port: int
    _log: bytearray = field(default_factory=bytearray)
    """What was read of the log past the last line returned (read from the pipe itself: the
    text stream's own buffer would hide lines from `select`)."""

    def get(
        self,
        path: str,
        *,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str = "",
        source: str = "127.0.0.1",
    ) -> Reply:
        """GET `path` over TCP (HTTPS with `tls`), with basic auth as `user` when given."""
        return get(self.port, path, tls=tls, user=user, password=password, source=source)

    def log_line_with(self, text: str, timeout_s: float = 30) -> str:
        """The next line of the daemon's log that holds `text` (those before it are passed)."""
        assert self.process.stderr is not None
        descriptor = self.process.stderr.fileno()
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while True:
            while b"\n" in self._log:
                end = self._log.index(b"\n") + 1
                line = self._log[:end].decode(errors="replace")
                del self._log[:end]
                if text in line:
                    return line
                seen.append(line)
            ready, _, _ = select.select([descriptor], [], [], max(0, deadline - time.monotonic()))
            assert ready, f"the daemon logged no {text!r} in {timeout_s:g}s; it logged {seen}"
            chunk = os.read(descriptor, 65536)
            assert chunk, f"the daemon ended without logging {text!r}; it logged {seen}"
            self._log.extend(chunk)


@contextmanager
def tcp_daemon(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, scenario: str | None = None
) -> Iterator[TcpDaemon]:
    """A daemon over a simulated node, listening on a free loopback port besides its socket."""
    port = free_port()
    extra = {} if scenario is None else {"scenario": scenario}
    with running_daemon(tmp_path, "--listen", str(port), *args, env=env, **extra) as (
        process,
        socket_path,
        _,
    ):
        yield TcpDaemon(process, socket_path, port)


def client_tls(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client's TLS that trusts `ca`, presenting `cert` when given."""
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key) if key else None)
    return context


@dataclass(frozen=True)
class Listener:
    """`TcpMetricsServer` serving in this process, so that a test can see inside it."""

    server: TcpMetricsServer
    port: int
    unblock: threading.Event
    """Lets the answers to `/block` go, which wait for it (at most 30 s)."""
    blocked: list[str]
    """One entry for each answer to `/block` begun."""

    def get(
        self,
        path: str = "/metrics",
        *,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str = "",
        source: str = "127.0.0.1",
    ) -> Reply:
        return get(self.port, path, tls=tls, user=user, password=password, source=source)


@contextmanager
def metrics_listener(web: WebConfig | None) -> Iterator[Listener]:
    """The daemon's TCP listener on a free loopback port, answering `METRICS` to whom `web`
    lets in (to `/block`, once `unblock` is set)."""
    unblock = threading.Event()
    blocked: list[str] = []

    def answer(method: str, target: str) -> Response:
        if target == "/block":
            blocked.append(target)
            unblock.wait(30)
        return Response(200, "text/plain; version=0.0.4", METRICS)

    server = TcpMetricsServer("127.0.0.1", 0, answer, web)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Listener(server, server.server_address[1], unblock, blocked)
    finally:
        unblock.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def connect_from(source: str, port: int) -> socket.socket:
    """A plain TCP connection to 127.0.0.1:`port` from the loopback address `source`."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
