"""HTTP/1.1 on the daemon's sockets: each request read whole under one deadline, every
answer JSON (but `/metrics`) and framed so that a kept-alive connection stays in step.

Not the standard library's handler: its timeout counts per byte, so a client
sending a byte every 2 s holds a connection forever; it answers errors in
HTML; and it leaves the body of a refused request unread, where the next
request on the connection then starts.
"""

from __future__ import annotations

import json
import socket
import time
from http import HTTPStatus

import msgspec

REQUEST_DEADLINE_S = 5.0
"""A request must arrive whole (head and body) this long after the daemon starts waiting
for it; an idle kept-alive connection is closed after as long."""
SEND_DEADLINE_S = 10.0
"""An answer must be taken by the client within this long."""
MAX_HEAD_BYTES = 16 << 10
MAX_BODY_BYTES = 64 << 10
"""A body (nothing here takes one) is read and dropped up to this size; a larger one ends
the connection."""


class Response(msgspec.Struct, frozen=True):
    """An answer: its status, the media type of its body, and any further headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, data: object, *headers: tuple[str, str]) -> Response:
    """An answer carrying `data` as JSON, as every answer does but `/metrics` and the probes."""
    return Response(status, "application/json", json.dumps(data).encode(), headers)


def text_response(status: int, text: str) -> Response:
    """A line of plain text: what the health and readiness probes answer."""
    return Response(status, "text/plain; charset=utf-8", text.encode())


def error_response(status: int, message: str, *headers: tuple[str, str]) -> Response:
    return json_response(status, {"error": message}, *headers)


class Request(msgspec.Struct, frozen=True):
    """A request's head, as far as the daemon reads it; its body is never kept."""

    method: str
    target: str
    keep_alive: bool
    authorization: str | None = None
    """The `Authorization` header, for a listener that asks for credentials."""


class BadRequest(Exception):
    """A request that cannot be answered in step: answered with `response`, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.response = error_response(status, message)


class Connection:
    """One client's connection: requests in, responses out, each under a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""
        self._closed = False

    def read_request(self, deadline: float | None = None) -> Request | None:
        """The next request, or `None` when the client closed or stayed idle before one.

        It must arrive whole by `deadline` (a `time.monotonic()`; default: `REQUEST_DEADLINE_S`
        from now)."""
        if deadline is None:
            deadline = time.monotonic() + REQUEST_DEADLINE_S
        while b"\r\n\r\n" not in (buffer := self._buffer.lstrip(b"\r\n")):
            self._buffer = buffer  # blank lines before a request are allowed, and skipped
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise BadRequest(431, f"request head over {MAX_HEAD_BYTES} bytes")
            if not self._receive(deadline):
                if self._buffer and not self._closed:
                    raise BadRequest(408, "request incomplete at its deadline")
                return None  # gone, or idle: nothing to answer
        head, self._buffer = buffer.split(b"\r\n\r\n", 1)
        if len(head) > MAX_HEAD_BYTES:
            raise BadRequest(431, f"request head over {MAX_HEAD_BYTES} bytes")
        request, body_bytes = _parse_head(head)
        self._skip_body(body_bytes, deadline)
        return request

    def send(self, response: Response, *, with_body: bool, keep_alive: bool) -> None:
        self._send_all(encode(response, with_body=with_body, keep_alive=keep_alive))

    def _receive(self, deadline: float) -> bool:
        """Adds what arrives before `deadline` to the buffer; False at the end or the deadline."""
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            return False
        self._sock.settimeout(remaining_s)
        try:
            chunk = self._sock.recv(1 << 16)
        except TimeoutError:
            return False
        self._buffer += chunk
        self._closed = not chunk
        return bool(chunk)

    def _skip_body(self, size: int, deadline: float) -> None:
        while len(self._buffer) < size:
            if not self._receive(deadline):
                raise BadRequest(408, "request body incomplete at its deadline")
        self._buffer = self._buffer[size:]

    def _send_all(self, data: bytes) -> None:
        deadline = time.monotonic() + SEND_DEADLINE_S
        view = memoryview(data)
        while view:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise TimeoutError(f"the client took no answer for {SEND_DEADLINE_S:g}s")
            self._sock.settimeout(remaining_s)
            view = view[self._sock.send(view) :]


def encode(response: Response, *, with_body: bool, keep_alive: bool) -> bytes:
    """The response on the wire; HEAD's has the headers of GET's, and no body."""
    lines = [
        f"HTTP/1.1 {response.status} {_reason(response.status)}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        *(f"{name}: {value}" for name, value in response.headers),
        *([] if keep_alive else ["Connection: close"]),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + response.body if with_body else head


def _parse_head(head: bytes) -> tuple[Request, int]:
    """The request and the size of its body."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "the request head is not ASCII") from None
    request_line, *header_lines = text.split("\r\n")
    words = request_line.split(" ")
    if len(words) != 3 or not words[0].isalpha() or not words[1]:
        raise BadRequest(400, f"not an HTTP request line: {request_line[:80]!r}")
    method, target, version = words
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505, f"{version[:20]!r} is not spoken here: use HTTP/1.1")
    headers = _parse_headers(header_lines)
    if "transfer-encoding" in headers:
        raise BadRequest(501, "a request body in chunks is not taken here")
    length = headers.get("content-length", "0")
    if not length.isdigit() or len(length) > 12:
        raise BadRequest(400, f"bad Content-Length: {length[:20]!r}")
    if int(length) > MAX_BODY_BYTES:
        raise BadRequest(413, f"request body over {MAX_BODY_BYTES} bytes; nothing here takes one")
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return Request(method, target, keep_alive, headers.get("authorization")), int(length)


def _parse_headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, f"not a header: {line[:80]!r}")
        key = name.lower()
        if key in headers and key == "content-length" and headers[key] != value.strip():
            raise BadRequest(400, "two different Content-Length headers")
        headers[key] = value.strip()
    return headers


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
