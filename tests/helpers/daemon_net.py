"""A real daemon with a TCP listener, and a client for it that speaks HTTPS where asked."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.daemon import running_daemon


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: str


@dataclass(frozen=True)
class TcpDaemon:
    process: subprocess.Popen[str]
    socket_path: Path
    port: int

    def get(
        self,
        path: str,
        *,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str = "",
    ) -> Reply:
        """GET `path` over TCP (HTTPS with `tls`), with basic auth as `user` when given."""
        if tls is None:
            connection: http.client.HTTPConnection = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=10
            )
        else:
            connection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=10, context=tls
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
