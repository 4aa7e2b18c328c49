"""A real HTTP server on loopback for the fleet's tests, answering each request as a route
says: what a node or Prometheus sends, or a misbehaviour (a drip, too much, the wrong
thing). Nodes that hang or refuse are `endpoints`'."""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "fleet" / "data"


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


@dataclass
class Reply:
    """What an endpoint answers: a status and body, or a misbehaviour."""

    body: bytes = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4"
    drip_s: float | None = None
    """Send the body a byte at a time, this long apart."""
    endless_bytes: int = 0
    """Send this many bytes of filler after the body, as fast as the client reads."""
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[str, dict[str, str]], Reply]
"""(path with query, request headers) -> Reply."""


class _Handler(BaseHTTPRequestHandler):
    route: Route

    def do_GET(self) -> None:
        self._reply(self.path)

    def do_POST(self) -> None:
        """A form POST is routed as the GET of its fields would be."""
        form = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self._reply(f"{self.path}?{form}")

    def _reply(self, path: str) -> None:
        reply = self.route(path, {k.lower(): v for k, v in self.headers.items()})
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for key, value in reply.headers.items():
            self.send_header(key, value)
        if not (reply.drip_s or reply.endless_bytes):
            self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up, as it should
            self._send(reply)

    def _send(self, reply: Reply) -> None:
        if reply.drip_s:
            for byte in reply.body or b"x" * 10_000:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(reply.drip_s)
            return
        self.wfile.write(reply.body)
        sent, block = 0, b"0" * (1 << 20)
        while sent < reply.endless_bytes:
            self.wfile.write(block)
            sent += len(block)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    # A refresh sends its dozen queries at once: past the standard backlog of 5, the
    # kernel drops connections, and each is retried a second later.
    request_queue_size = 128


@contextmanager
def serving(route: Route, *, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """A server on loopback answering with `route`; yields its base URL."""
    handler = type("Handler", (_Handler,), {"route": staticmethod(route)})
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def always(reply: Reply) -> Route:
    return lambda path, headers: reply
