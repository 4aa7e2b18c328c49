"""A listener's connection slots, shared fairly among its clients.

At most `MAX_CONNECTIONS` connections are served at once, and at most
`MAX_CONNECTIONS_PER_CLIENT` for one client (a uid on the socket, an address over
TCP), so that one client's crowd leaves room for the others. When every slot is
taken, a client that holds none, or two fewer than the client holding the most,
still gets in: the connection of that client that has waited longest for a
request (an idle one, or one shaking hands or trickling its request in) is closed
to make room. Clients holding as many as each other cannot push each other out
(they would take turns forever); a connection being answered is never closed for
another. Whoever cannot get in is answered 503.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter

import msgspec

MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_CLIENT = 16


class Slot(msgspec.Struct, eq=False):
    """One connection's place in the pool; changed only under the pool's lock."""

    client: str
    descriptor: int
    """The connection's file descriptor: the same under TLS, which wraps the socket."""
    waiting_since: float | None = msgspec.field(default_factory=time.monotonic)
    """Since when it waits for a request; `None` while a request is answered."""
    closed: bool = False
    """Given back, or closed to make room for a newcomer."""


class ConnectionPool:
    """The slots of one listener; safe from many threads."""

    def __init__(
        self, total: int = MAX_CONNECTIONS, per_client: int = MAX_CONNECTIONS_PER_CLIENT
    ) -> None:
        self._total = total
        self._per_client = per_client
        self._lock = threading.Lock()
        self._slots: set[Slot] = set()
        self._held: Counter[str] = Counter()

    def __len__(self) -> int:
        """How many connections hold a slot."""
        with self._lock:
            return len(self._slots)

    def take(self, client: str, connection: socket.socket) -> Slot | None:
        """A slot for `connection`, making room if need be; `None`: refuse it."""
        with self._lock:
            if self._held[client] >= self._per_client:
                return None
            if len(self._slots) >= self._total and not self._make_room(client):
                return None
            slot = Slot(client, connection.fileno())
            self._slots.add(slot)
            self._held[client] += 1
            return slot

    def answering(self, slot: Slot) -> bool:
        """Marks `slot` as answering a request; False when it was closed for a newcomer."""
        with self._lock:
            slot.waiting_since = None
            return not slot.closed

    def waiting(self, slot: Slot) -> None:
        """Marks `slot` as waiting for its next request: the first to close if room is needed."""
        with self._lock:
            slot.waiting_since = time.monotonic()

    def give_back(self, slot: Slot) -> None:
        """Frees `slot` (again: no harm); before its descriptor is closed, so that room is
        never made by shutting down a descriptor some other connection now has."""
        with self._lock:
            self._forget(slot)

    def _make_room(self, newcomer: str) -> bool:
        waiting = [slot for slot in self._slots if slot.waiting_since is not None]
        if not waiting:
            return False
        victim = max(
            waiting,
            key=lambda slot: (self._held[slot.client], -(slot.waiting_since or 0.0)),
        )
        held = self._held[newcomer]
        if held > 0 and self._held[victim.client] < held + 2:
            return False  # no fairer after the move
        self._forget(victim)
        # Through a duplicate: the connection's thread owns (and will close) the socket object.
        with (
            contextlib.suppress(OSError),
            socket.fromfd(victim.descriptor, socket.AF_UNIX, socket.SOCK_STREAM) as duplicate,
        ):
            duplicate.shutdown(socket.SHUT_RDWR)  # its thread wakes up to an end of stream
        return True

    def _forget(self, slot: Slot) -> None:
        if slot.closed:
            return
        slot.closed = True
        self._slots.discard(slot)
        self._held[slot.client] -= 1
        if self._held[slot.client] <= 0:
            del self._held[slot.client]
