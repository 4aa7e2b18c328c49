"""HTTP GETs (and form POSTs), all at once, each bounded in time and in bytes: the
standard library only.

A socket timeout bounds each read, not a whole answer: a server that sends a byte a
second would keep `http.client` for ever. So every request runs in a thread of its
own and the caller waits for all of them until one deadline; a request still running
then is given up (its socket shut, so that its thread ends) and reported as timed out.
One slow or hung server therefore costs its timeout once, never the sum of all.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MAX_THREADS = 1024
"""Requests beyond this many run in waves, each wave with its own deadline. A thread
waiting on a socket costs little memory (its stack is reserved, not used), and a fleet
scraped directly is a lab's, not a data centre's: that is Prometheus's job."""
_CHUNK_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """How to reach a server: a CA for its certificate, a client certificate, and the
    `Authorization` header's value (kept out of `repr`: it is a secret)."""

    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    authorization: str | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server against `ca_file` (else the
        system's CAs) and presents the client certificate, if any."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


@dataclass(frozen=True, slots=True)
class Answer:
    """A server's answer, or why there is none (`error`, one line)."""

    status: int | None = None
    body: bytes = b""
    content_type: str = ""
    error: str | None = None


Digest = Callable[[Answer], object]
"""Work on an answer done in its request's thread as soon as it comes (parsing a node's
text while slower nodes are still awaited)."""


class _Request:
    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        context: ssl.SSLContext | None,
        digest: Digest | None = None,
        form: bytes | None = None,
    ):
        self.url, self.headers, self.context = url, headers, context
        self.form = form
        """A form to POST (its fields urlencoded) instead of a GET."""
        self.connection: http.client.HTTPConnection | None = None
        self.answer: Answer | None = None
        self.digest = digest
        self.digested: object = None
        self.lock = threading.Lock()

    def cancel(self) -> None:
        with self.lock:
            connection = self.connection
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def get_all(
    urls: Sequence[str],
    *,
    options: HttpOptions,
    timeout_s: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    forms: Sequence[bytes | None] | None = None,
) -> list[Answer]:
    """The answers to GET each of `urls`, in order; each within `timeout_s` (connecting,
    TLS, headers and the whole body) and `max_bytes` (after decompression). Where
    `forms[i]` is given, `urls[i]` is sent it by POST instead."""
    found = get_all_digested(
        urls,
        options=options,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        headers=headers,
        forms=forms,
    )
    return [answer for answer, _ in found]


def get_all_digested(
    urls: Sequence[str],
    *,
    options: HttpOptions,
    timeout_s: float,
    max_bytes: int,
    headers: dict[str, str] | None = None,
    digest: Digest | None = None,
    forms: Sequence[bytes | None] | None = None,
) -> list[tuple[Answer, object]]:
    """As `get_all`, each answer with what `digest` made of it in the request's thread,
    or `None` where it was not done by the deadline (or no `digest` was given)."""
    needs_tls = any(url.startswith("https:") for url in urls)
    context = options.ssl_context() if needs_tls else None
    sent = {"Accept-Encoding": "gzip", "User-Agent": "gpuwatch-fleet", **(headers or {})}
    if options.authorization:
        sent["Authorization"] = options.authorization
    found: list[tuple[Answer, object]] = []
    bodies = list(forms) if forms is not None else [None] * len(urls)
    for start in range(0, len(urls), MAX_THREADS):
        wave = [
            _Request(url, sent, context, digest, form)
            for url, form in zip(urls[start : start + MAX_THREADS], bodies[start:], strict=False)
        ]
        answers = _run(wave, timeout_s, max_bytes)
        found += [(a, r.digested) for a, r in zip(answers, wave, strict=True)]
    return found


def _run(requests: list[_Request], timeout_s: float, max_bytes: int) -> list[Answer]:
    deadline = time.monotonic() + timeout_s
    threads = [
        threading.Thread(target=_fetch, args=(r, deadline, max_bytes), daemon=True)
        for r in requests
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    late = Answer(error=f"no complete answer within {timeout_s:g}s")
    answers = []
    for request in requests:
        with request.lock:
            answer = request.answer
            if answer is None:
                request.answer = late
        if answer is None:
            request.cancel()
        answers.append(answer or late)
    return answers


def _fetch(request: _Request, deadline: float, max_bytes: int) -> None:
    try:
        answer = _get(request, deadline, max_bytes)
    except TimeoutError:
        answer = Answer(error="timed out")
    except ssl.SSLError as error:
        answer = Answer(error=f"TLS failed: {error.reason or error.strerror or error}")
    except (OSError, http.client.HTTPException, zlib.error) as error:
        answer = Answer(error=_reason(error))
    with request.lock:
        if request.answer is None:
            request.answer = answer
        else:
            answer = request.answer  # given up on: it is reported as timed out
    if request.connection is not None:
        request.connection.close()
    if request.digest is not None:
        request.digested = request.digest(answer)


def _get(request: _Request, deadline: float, max_bytes: int) -> Answer:
    parts = urllib.parse.urlsplit(request.url)
    remaining = max(0.001, deadline - time.monotonic())
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=remaining, context=request.context
        )
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=remaining)
    with request.lock:
        if request.answer is not None:  # given up before it started
            return request.answer
        request.connection = connection
    target = parts.path or "/"
    if request.form is not None:
        headers = {**request.headers, "Content-Type": "application/x-www-form-urlencoded"}
        connection.request("POST", target, body=request.form, headers=headers)
    else:
        target = f"{target}?{parts.query}" if parts.query else target
        connection.request("GET", target, headers=request.headers)
    response = connection.getresponse()
    body = _read(response, deadline, max_bytes)
    return Answer(response.status, body, response.getheader("Content-Type", "") or "")


def _read(response: http.client.HTTPResponse, deadline: float, max_bytes: int) -> bytes:
    gzipped = (response.getheader("Content-Encoding") or "").strip().lower() == "gzip"
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(_CHUNK_BYTES):
        if time.monotonic() > deadline:
            raise TimeoutError
        if inflate is not None:
            chunk = inflate.decompress(chunk, max_bytes + 1 - size)
        size += len(chunk)
        if size > max_bytes:
            raise _TooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


class _TooLarge(OSError):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"response too large (over {max_bytes >> 20}MiB)")


def _reason(error: BaseException) -> str:
    if isinstance(error, _TooLarge):
        return str(error)
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    if isinstance(error, http.client.HTTPException):
        return f"not an HTTP answer ({type(error).__name__})"
    if isinstance(error, zlib.error):
        return "a gzip body that does not inflate"
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__
