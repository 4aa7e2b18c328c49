"""HTTP requests to many servers at once, all within one `Budget`: a deadline for whole
answers and a cap on their bytes. The standard library's `http.client`, a thread a request.

A socket timeout bounds each read from a socket, not a whole answer: a server that sends a
byte a second would hold a request for ever. So each request runs in a thread, and the
caller waits for them all until the deadline; then it shuts the socket of every request
still running (its thread ends at once) and reports it timed out. One hung or dripping
server costs the deadline once, never the sum of all, and never hides another's answer.
The threads are daemon threads, not a `concurrent.futures` pool: a pool's workers are
joined when the interpreter exits, and a name lookup in one of them cannot be cut short.
"""

from __future__ import annotations

import contextlib
import http.client
import queue
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

import msgspec

REFUSED = "connection refused"
MAX_THREADS = 1024
"""Requests at once, at the most; the rest wait for a thread, within the same deadline."""
_CHUNK_BYTES = 64 << 10
T = TypeVar("T")


class HttpOptions(msgspec.Struct, frozen=True):
    """How to reach a server: a CA for its certificate, a client certificate, and the
    `Authorization` header's value (kept out of `repr`: it is a secret)."""

    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    authorization: str | None = None

    def __repr__(self) -> str:
        shown = "..." if self.authorization is not None else None
        return (
            f"HttpOptions(ca_file={self.ca_file!r}, client_cert={self.client_cert!r}, "
            f"client_key={self.client_key!r}, authorization={shown})"
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that verifies the server against `ca_file` (else the
        system's CAs) and presents the client certificate, if any."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


class Request(msgspec.Struct, frozen=True):
    """A GET of `url`; where `form` is given, a POST of that urlencoded form to it."""

    url: str
    form: bytes | None = None


class Answer(msgspec.Struct, frozen=True):
    """A server's answer, or why there is none (`error`, one line)."""

    status: int | None = None
    body: bytes = b""
    content_type: str = ""
    error: str | None = None


class Budget:
    """What one read, or one command's reads together, may spend: time until one deadline
    (connecting, TLS, headers and every body), and `max_bytes` for all its answers
    together, each at most `answer_bytes` (after decompression). Shared by the threads of
    a read, and by every read of a command (`within`)."""

    def __init__(
        self, timeout_s: float, max_bytes: int, *, answer_bytes: int = 0, more: str = ""
    ) -> None:
        """`more`: how to allow more bytes, said where a read is over them."""
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.max_bytes = max_bytes
        self.answer_bytes = min(answer_bytes or max_bytes, max_bytes)
        self.more = more
        self._tally = _Tally()

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def within(self, answer_bytes: int) -> Budget:
        """This budget, with each answer at most `answer_bytes`: the same deadline, and
        the bytes spent through either counted against both."""
        narrowed = Budget.__new__(Budget)
        narrowed.timeout_s, narrowed.deadline = self.timeout_s, self.deadline
        narrowed.max_bytes, narrowed.more = self.max_bytes, self.more
        narrowed.answer_bytes = min(answer_bytes, self.answer_bytes)
        narrowed._tally = self._tally
        return narrowed

    def spend(self, count: int) -> None:
        """Counts `count` bytes more; `TooLarge` once the read is over its bytes."""
        if self._tally.add(count) > self.max_bytes:
            raise self._over_all()

    def answer_over(self) -> TooLarge:
        """Why an answer over `answer_bytes` is refused; where one answer may take the
        read's whole cap, as for all of them (with how to allow more)."""
        if self.answer_bytes < self.max_bytes:
            return TooLarge(f"answer too large (over {self.answer_bytes >> 20}MiB)")
        return self._over_all()

    def _over_all(self) -> TooLarge:
        more = f": {self.more}" if self.more else ""
        return TooLarge(f"answers too large (over {self.max_bytes >> 20}MiB in all){more}")


class _Tally:
    """Bytes spent, counted by many threads."""

    def __init__(self) -> None:
        self._spent = 0
        self._lock = threading.Lock()

    def add(self, count: int) -> int:
        with self._lock:
            self._spent += count
            return self._spent


class TooLarge(OSError):
    """An answer, or a read's answers together, over their cap of bytes."""


def fetch_all(
    requests: Sequence[Request],
    *,
    options: HttpOptions,
    budget: Budget,
    then: Callable[[Answer], T],
    headers: Mapping[str, str] | None = None,
) -> list[T]:
    """What `then` makes of the answer to each request, in order. `then` runs in the
    request's thread as soon as its answer is in (parsing a node's text while slower ones
    are awaited); for a request with no whole answer by the deadline it runs here, on an
    `Answer` whose error says so."""
    sent = {"Accept-Encoding": "gzip", "User-Agent": "gpuwatch-fleet", **(headers or {})}
    if options.authorization:
        sent["Authorization"] = options.authorization
    context = options.ssl_context() if any(r.url.startswith("https:") for r in requests) else None
    calls = [_Call(request, sent, context, budget, then) for request in requests]
    waiting: queue.SimpleQueue[_Call[T]] = queue.SimpleQueue()
    for call in calls:
        waiting.put(call)
    for _ in range(min(len(calls), MAX_THREADS)):
        threading.Thread(target=_work, args=(waiting,), daemon=True).start()
    for call in calls:
        call.finished.wait(max(0.0, budget.seconds_left()))
    late = Answer(error=f"no complete answer within {budget.timeout_s:g}s")
    return [call.result(late) for call in calls]


def _work(waiting: queue.SimpleQueue[_Call[T]]) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            waiting.get_nowait().run()


class _Call(Generic[T]):
    """One request: its connection (shut from outside at the deadline) and its result."""

    def __init__(
        self,
        request: Request,
        headers: dict[str, str],
        context: ssl.SSLContext | None,
        budget: Budget,
        then: Callable[[Answer], T],
    ) -> None:
        self.request, self.headers, self.context = request, headers, context
        self.budget, self.then = budget, then
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._answered = self._given_up = False
        self._result: T | None = None
        self._failure: BaseException | None = None

    def run(self) -> None:
        try:
            if self.budget.seconds_left() > 0:
                answer = _answer(self)
                with self._lock:
                    self._answered = not self._given_up
                if self._answered:
                    self._result = self.then(answer)
        except BaseException as failure:  # re-raised by the caller's thread
            self._failure = failure
        finally:
            self.finished.set()

    def hold(self, connection: http.client.HTTPConnection) -> bool:
        """Keeps the connection to shut at the deadline; `False`: it has passed."""
        with self._lock:
            self._connection = connection
            return not self._given_up

    def result(self, late: Answer) -> T:
        """Its result, once its answer is in; else, given up on, what `then` makes of
        `late`."""
        with self._lock:
            self._given_up = not self._answered
            connection = self._connection
        if self._given_up:
            sock = connection.sock if connection is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # its thread's blocked read ends
            return self.then(late)
        self.finished.wait()  # its `then` runs on an answer already in: not for long
        if self._failure is not None:
            raise self._failure
        return self._result  # type: ignore[return-value]


def _answer(call: _Call[T]) -> Answer:
    try:
        return _get(call)
    except TimeoutError:
        return Answer(error="timed out")
    except ssl.SSLError as error:
        return Answer(error=f"TLS failed: {error.reason or error.strerror or error}")
    except (OSError, http.client.HTTPException, zlib.error) as error:
        return Answer(error=_reason(error))


def _get(call: _Call[T]) -> Answer:
    parts = urllib.parse.urlsplit(call.request.url)
    timeout_s = max(0.001, call.budget.seconds_left())
    connection = (
        http.client.HTTPSConnection(parts.netloc, timeout=timeout_s, context=call.context)
        if parts.scheme == "https"
        else http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    )
    if not call.hold(connection):
        return Answer(error="given up")  # the deadline passed before it started
    with contextlib.closing(connection):
        path = parts.path or "/"
        if call.request.form is not None:
            headers = {**call.headers, "Content-Type": "application/x-www-form-urlencoded"}
            connection.request("POST", path, body=call.request.form, headers=headers)
        else:
            path = f"{path}?{parts.query}" if parts.query else path
            connection.request("GET", path, headers=call.headers)
        response = connection.getresponse()
        body = _body(response, call.budget)
        return Answer(response.status, body, response.getheader("Content-Type") or "")


def _body(response: http.client.HTTPResponse, budget: Budget) -> bytes:
    """The whole body, inflated where gzipped, within the budget's bytes."""
    gzipped = (response.getheader("Content-Encoding") or "").strip().lower() == "gzip"
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    most = budget.answer_bytes
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(_CHUNK_BYTES):
        if inflate is not None:
            chunk = inflate.decompress(chunk, most + 1 - size)
        size += len(chunk)
        if size > most:
            raise budget.answer_over()
        budget.spend(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def _reason(error: BaseException) -> str:
    if isinstance(error, TooLarge):
        return str(error)
    if isinstance(error, ConnectionRefusedError):
        return REFUSED
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    if isinstance(error, http.client.HTTPException):
        return f"not an HTTP answer ({type(error).__name__})"
    if isinstance(error, zlib.error):
        return "a gzip body that does not inflate"
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__
