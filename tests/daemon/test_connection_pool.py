"""Connections shared fairly: no address, however many connections it holds, keeps a newcomer out.

The pool's rules on socket pairs, then the daemon's TCP listener (in this process, over
TLS) held by eight addresses, 127.0.0.2 to 127.0.0.9, sixteen connections each.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gpuwatch.daemon import listeners
from gpuwatch.daemon.connection_pool import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    ConnectionPool,
)
from gpuwatch.daemon.listeners import source_name
from gpuwatch.daemon.webconfig import load_web_config
from tests.helpers.certs import make_certs
from tests.helpers.daemon_net import Listener, client_tls, connect_from, metrics_listener
from tests.helpers.wait import wait_until

HOGS = [f"127.0.0.{n}" for n in range(2, 10)]


def closed_by_peer(connection: socket.socket) -> bool:
    """Whether the other end has closed `connection` (without waiting for it)."""
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """Socket pairs: the pool's end, and the client's."""
    made: list[tuple[socket.socket, socket.socket]] = []
    with ExitStack() as stack:

        def pair() -> tuple[socket.socket, socket.socket]:
            ends = socket.socketpair()
            for end in ends:
                stack.enter_context(end)
            made.append(ends)
            return ends

        yield [pair() for _ in range(8)]


def test_a_full_pool_closes_the_longest_idle_connection_of_the_client_holding_most(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    # GIVEN a pool of 4 held by "a" (three connections, idle) and "b" (one, idle longest)
    pool = ConnectionPool(total=4, per_client=3)
    b = pool.take("b", pairs[0][0])
    a = [pool.take("a", pairs[n][0]) for n in (1, 2, 3)]
    assert b is not None and None not in a
    # WHEN "c" arrives
    c = pool.take("c", pairs[4][0])
    # THEN it gets a slot, and the first idle connection of "a" is closed for it
    assert c is not None and len(pool) == 4
    assert [closed_by_peer(pairs[n][1]) for n in range(4)] == [False, True, False, False]
    # AND "a", coming back, cannot push out "b" or "c", who hold no fewer than it would
    assert pool.take("a", pairs[5][0]) is None
    assert not any(closed_by_peer(pairs[n][1]) for n in (0, 2, 3, 4))


def test_a_connection_being_answered_is_never_closed_for_a_newcomer(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    # GIVEN a full pool whose connections are all being answered
    pool = ConnectionPool(total=2, per_client=2)
    held = [pool.take("a", pairs[n][0]) for n in (0, 1)]
    for slot in held:
        assert slot is not None and pool.answering(slot)
    # WHEN a newcomer arrives THEN it is refused, and no answer is cut short
    assert pool.take("b", pairs[2][0]) is None
    assert not any(closed_by_peer(pairs[n][1]) for n in (0, 1))
    # AND once one waits for its next request, it is the one that makes room
    assert held[1] is not None
    pool.waiting(held[1])
    assert pool.take("b", pairs[2][0]) is not None and closed_by_peer(pairs[1][1])
    assert not pool.answering(held[1]), "its thread is told it was closed"


def test_one_client_gets_no_more_than_its_cap_even_with_room_left(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    pool = ConnectionPool(total=8, per_client=2)
    assert [pool.take("a", pairs[n][0]) is not None for n in range(3)] == [True, True, False]
    slot = pool.take("b", pairs[3][0])
    assert slot is not None
    # AND a slot given back is free again, once only
    pool.give_back(slot)
    pool.give_back(slot)
    assert len(pool) == 2


@pytest.mark.parametrize(
    ("address", "name"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ],
    ids=["ipv4", "ipv4-mapped", "ipv6", "ipv6-same-64"],
)
def test_an_ipv6_client_is_its_64_which_it_may_fill_with_addresses(address: str, name: str) -> None:
    assert source_name(address) == name


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Listener]:
    """The TCP listener over TLS; an idle connection is not let go by its deadline here, so
    that only the pool's rules free a slot."""
    monkeypatch.setattr(listeners, "FIRST_REQUEST_S", 120.0)
    make_certs(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    with metrics_listener(load_web_config(str(config))) as listener:
        yield listener


def test_eight_addresses_holding_every_slot_leave_a_ninth_served(
    listener: Listener, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        # GIVEN eight addresses holding 16 idle connections each: every slot
        hogs = [
            stack.enter_context(connect_from(hog, listener.port))
            for hog in HOGS
            for _ in range(MAX_CONNECTIONS_PER_CLIENT)
        ]
        assert len(hogs) == MAX_CONNECTIONS
        wait_until(lambda: len(listener.server.pool) == MAX_CONNECTIONS, "every slot taken")
        # WHEN a ninth address scrapes
        reply = listener.get(tls=client_tls(tmp_path / "ca.crt"))
        # THEN it is served, and the connection idle longest was closed for it
        assert reply.status == 200
        assert [n for n, hog in enumerate(hogs) if closed_by_peer(hog)] == [0]
        # AND a hog asking for a seventeenth connection is refused, in a word
        with connect_from(HOGS[-1], listener.port) as extra:
            assert extra.recv(4096).startswith(b"HTTP/1.1 503 ")


def test_when_every_connection_is_being_answered_a_newcomer_is_told_to_come_back(
    listener: Listener,
) -> None:
    # GIVEN 128 connections over plain TCP (TLS makes no difference to the pool) that all
    # wait for their answers
    listener.server.web = None
    with ExitStack() as stack:
        hogs = []
        for hog in HOGS:
            for _ in range(MAX_CONNECTIONS_PER_CLIENT):
                hogs.append(stack.enter_context(connect_from(hog, listener.port)))
                hogs[-1].sendall(b"GET /block HTTP/1.1\r\nConnection: close\r\n\r\n")
        wait_until(lambda: len(listener.blocked) == MAX_CONNECTIONS, "every answer begun")
        # WHEN a newcomer arrives THEN it is answered 503
        with connect_from("127.0.0.1", listener.port) as newcomer:
            assert newcomer.recv(4096).startswith(b"HTTP/1.1 503 ")
        # AND no answer was cut short for it
        listener.unblock.set()
        answers = [hog.makefile("rb").read() for hog in hogs]
        assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
