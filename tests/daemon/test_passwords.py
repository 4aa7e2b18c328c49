"""Passwords on the TCP listener cost the one who guesses them, not the daemon.

The daemon's own listener, over TLS with certificates made here, in this process so
that the tests can count bcrypt's checks; guessers come from 127.0.0.2 to 127.0.0.5.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import bcrypt
import pytest

from gpuwatch.daemon import basic_auth, listeners
from gpuwatch.daemon.webconfig import WebConfig, keep_learnt, load_web_config
from tests.helpers.certs import Certs, make_certs
from tests.helpers.daemon_net import (
    METRICS,
    Listener,
    client_tls,
    connect_from,
    metrics_listener,
)
from tests.helpers.wait import wait_until
from tests.helpers.web_config import PASSWORD, bcrypt_hash, web_config

SERVER_TLS = "  cert_file: server.crt\n  key_file: server.key\n"
GUESSERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@dataclass
class Checks:
    """bcrypt's checks as the listener made them: the hash each was against, and how many
    ran at once at most."""

    hashes: list[bytes] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    most_at_once: int = 0
    _now: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def spy(self, check: Callable[[bytes, bytes], bool]) -> Callable[[bytes, bytes], bool]:
        def counted(password: bytes, hashed: bytes) -> bool:
            with self._lock:
                self.hashes.append(hashed)
                self.threads.add(threading.current_thread().name)
                self._now += 1
                self.most_at_once = max(self.most_at_once, self._now)
            try:
                return check(password, hashed)
            finally:
                with self._lock:
                    self._now -= 1

        return counted


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Checks:
    seen = Checks()
    monkeypatch.setattr(bcrypt, "checkpw", seen.spy(bcrypt.checkpw))
    return seen


@pytest.fixture(autouse=True)
def short_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A guesser past its budget waits 0.2 s for each new connection, not seconds."""
    monkeypatch.setattr(listeners, "HOLD_S", 0.2)


@contextmanager
def listening(certs: Certs, users: dict[str, str], cost: int = 4) -> Iterator[Listener]:
    """The listener over TLS, asking for `users`' passwords (hashed at bcrypt's `cost`)."""
    config = certs.ca.parent / f"web-{cost}.yml"
    config.write_text(web_config(SERVER_TLS, users, cost))
    with metrics_listener(load_web_config(str(config))) as listener:
        yield listener


@pytest.fixture
def listener(certs: Certs) -> Iterator[Listener]:
    with listening(certs, {"prometheus": PASSWORD}) as listener:
        yield listener


def test_a_scraper_pays_bcrypt_once_for_its_password(
    listener: Listener, certs: Certs, checks: Checks
) -> None:
    # GIVEN a scraper with the right password, WHEN it scrapes ten times
    tls = client_tls(certs.ca)
    replies = [listener.get(tls=tls, user="prometheus", password=PASSWORD) for _ in range(10)]
    # THEN every scrape is answered, and bcrypt ran once, on the checker's thread of its own
    assert [reply.status for reply in replies] == [200] * 10
    assert replies[-1].body == METRICS.decode()
    assert len(checks.hashes) == 1
    assert checks.threads == {"gpuwatch-passwords_0"}


def test_wrong_passwords_beyond_a_small_budget_are_answered_429_without_bcrypt(
    listener: Listener, certs: Certs, checks: Checks
) -> None:
    # GIVEN a guesser at 127.0.0.2, WHEN it tries more passwords than its budget
    tls = client_tls(certs.ca)
    tries = basic_auth.FAILURE_BURST + 4
    replies = [
        listener.get(tls=tls, user="prometheus", password=f"guess {n}", source="127.0.0.2")
        for n in range(tries)
    ]
    # THEN the budget's tries are checked and refused, and the rest told when to come back
    # (each once its connection waited its turn), with no check at all
    statuses = [reply.status for reply in replies]
    assert statuses == [401] * basic_auth.FAILURE_BURST + [429] * 4
    assert len(checks.hashes) == basic_auth.FAILURE_BURST
    retry_after = int(replies[-1].headers["retry-after"])
    assert 1 <= retry_after <= basic_auth.FAILURE_REFILL_S
    assert "www-authenticate" not in replies[-1].headers
    # AND the right password from another address is checked and served
    other = listener.get(tls=tls, user="prometheus", password=PASSWORD, source="127.0.0.3")
    assert other.status == 200
    assert len(checks.hashes) == basic_auth.FAILURE_BURST + 1
    # AND so is it from the guesser's address, verified already, once the connection waited
    right = listener.get(tls=tls, user="prometheus", password=PASSWORD, source="127.0.0.2")
    assert right.status == 200 and len(checks.hashes) == basic_auth.FAILURE_BURST + 1


def test_a_request_without_credentials_costs_no_budget(
    listener: Listener, certs: Certs, checks: Checks
) -> None:
    tls = client_tls(certs.ca)
    # GIVEN a client that asks without credentials more often than the budget allows guesses
    statuses = {listener.get(tls=tls, source="127.0.0.2").status for _ in range(8)}
    # THEN it is challenged each time, with no check; and its budget stays whole
    assert statuses == {401} and not checks.hashes
    assert listener.get(
        tls=tls, user="prometheus", password="wrong", source="127.0.0.2"
    ).status == (401)


def test_an_unknown_user_is_checked_at_the_users_own_cost(certs: Certs, checks: Checks) -> None:
    # GIVEN users whose hashes are of cost 5 (not bcrypt's default, nor the lowest)
    with listening(certs, {"prometheus": PASSWORD, "grafana": "other"}, cost=5) as listener:
        tls = client_tls(certs.ca)
        # WHEN an unknown user and a known one try a wrong password
        unknown = listener.get(tls=tls, user="mallory", password="guess", source="127.0.0.2")
        known = listener.get(tls=tls, user="prometheus", password="guess", source="127.0.0.3")
    # THEN both are refused alike, each after a check of cost 5: the time of the answer tells
    # nothing of which users exist
    assert (unknown.status, known.status) == (401, 401)
    assert [hashed[:7] for hashed in checks.hashes] == [b"$2b$05$"] * 2
    assert checks.hashes[0] != checks.hashes[1]


def test_passwords_are_checked_one_at_a_time(certs: Certs, checks: Checks) -> None:
    # GIVEN hashes slow enough (cost 8) that checks asked for together would overlap
    with listening(certs, {"prometheus": PASSWORD}, cost=8) as listener:
        tls = client_tls(certs.ca)

        def guess(number: int) -> int:
            source = GUESSERS[number % len(GUESSERS)]
            return listener.get(
                tls=tls, user="prometheus", password=f"guess {number}", source=source
            ).status

        # WHEN four addresses send two guesses each, all at once
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(guess, range(8)))
    # THEN each guess is checked, and never two at the same time
    assert statuses == [401] * 8
    assert len(checks.hashes) == 8 and checks.most_at_once == 1


def test_a_new_web_config_hands_out_no_new_budget(listener: Listener, certs: Certs) -> None:
    tls = client_tls(certs.ca)
    # GIVEN a guesser that spent its budget
    for n in range(basic_auth.FAILURE_BURST):
        listener.get(tls=tls, user="prometheus", password=f"guess {n}", source="127.0.0.2")
    # WHEN the web config is read again (a reload)
    config = certs.ca.parent / "reloaded.yml"
    config.write_text(web_config(SERVER_TLS, {"prometheus": PASSWORD}))
    listener.server.web = load_web_config(str(config))
    # THEN its next guess is still answered 429
    reply = listener.get(tls=tls, user="prometheus", password="again", source="127.0.0.2")
    assert reply.status == 429


def test_a_spent_source_waits_for_its_turn_without_a_slot_or_a_thread(
    listener: Listener, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = client_tls(certs.ca)
    # GIVEN a guesser at 127.0.0.2 that spent its budget, whose new connections wait long
    for n in range(basic_auth.FAILURE_BURST):
        listener.get(tls=tls, user="prometheus", password=f"guess {n}", source="127.0.0.2")
    monkeypatch.setattr(listeners, "HOLD_S", 120.0)
    # WHEN it opens a connection
    with connect_from("127.0.0.2", listener.port) as waiting:
        # THEN the connection waits, holding no slot
        wait_until(lambda: listener.server.held == 1, "the connection to wait")
        assert len(listener.server.pool) == 0
        # AND another address is served meanwhile
        reply = listener.get(tls=tls, user="prometheus", password=PASSWORD, source="127.0.0.3")
        assert reply.status == 200 and listener.server.held == 1
        waiting.setblocking(False)
        with pytest.raises(BlockingIOError):
            waiting.recv(1)


def test_a_budget_refills_one_check_at_a_time() -> None:
    # GIVEN a budget of two failed checks, one more every 10 s, on a clock of our own
    now = [100.0]
    checker = basic_auth.PasswordChecker(burst=2, refill_s=10.0, clock=lambda: now[0])
    try:
        # WHEN a source spends it THEN it is told how long until the next
        assert [checker.take("a"), checker.take("a"), checker.take("a")] == [None, None, 10]
        assert checker.spent("a") and not checker.spent("b")
        now[0] += 4.0
        assert checker.take("a") == 6
        # AND one comes back with each refill, never more than the budget
        now[0] += 6.0
        assert not checker.spent("a") and checker.take("a") is None and checker.spent("a")
        now[0] += 1000.0
        assert [checker.take("a"), checker.take("a"), checker.take("a")] == [None, None, 10]
    finally:
        checker.close()


def test_a_password_refused_once_is_refused_again_without_bcrypt_or_budget(
    listener: Listener, certs: Certs, checks: Checks
) -> None:
    tls = client_tls(certs.ca)
    # GIVEN a client at 127.0.0.2 sending one wrong password, again and again
    stale = {"tls": tls, "user": "prometheus", "password": "old", "source": "127.0.0.2"}
    statuses = [listener.get(**stale).status for _ in range(basic_auth.FAILURE_BURST + 3)]
    # THEN it is refused each time, never told to wait, after one check
    assert statuses == [401] * (basic_auth.FAILURE_BURST + 3)
    assert len(checks.hashes) == 1
    # AND its source's budget lost that one check only: the right password gets in
    right = listener.get(tls=tls, user="prometheus", password=PASSWORD, source="127.0.0.2")
    assert right.status == 200


def reload(listener: Listener, certs: Certs, users: dict[str, str]) -> None:
    """The listener's web config read again, with `users`, as a SIGHUP does."""
    config = certs.ca.parent / "reloaded.yml"
    config.write_text(web_config(SERVER_TLS, users))
    fresh = load_web_config(str(config))
    keep_learnt(listener.server.web, fresh)
    listener.server.web = fresh


def spend_budget(listener: Listener, certs: Certs, source: str) -> None:
    tls = client_tls(certs.ca)
    for n in range(basic_auth.FAILURE_BURST):
        guess = listener.get(tls=tls, user="prometheus", password=f"guess {n}", source=source)
        assert guess.status == 401


def web_of(certs: Certs, hashes: dict[str, str]) -> WebConfig:
    """A web config over TLS whose users have these very `hashes`."""
    config = certs.ca.parent / "hashed.yml"
    lines = "".join(f"  {user}: {hashed}\n" for user, hashed in hashes.items())
    config.write_text(f"tls_server_config:\n{SERVER_TLS}basic_auth_users:\n{lines}")
    return load_web_config(str(config))


def test_a_reload_keeps_the_verified_passwords_of_users_whose_hash_is_the_same(
    certs: Certs, checks: Checks
) -> None:
    tls = client_tls(certs.ca)
    hashes = {"prometheus": bcrypt_hash(PASSWORD), "grafana": bcrypt_hash("other")}
    with metrics_listener(web_of(certs, hashes)) as listener:
        # GIVEN both users verified, and a guesser that spent the budget of their address
        assert listener.get(tls=tls, user="prometheus", password=PASSWORD).status == 200
        assert listener.get(tls=tls, user="grafana", password="other").status == 200
        spend_budget(listener, certs, "127.0.0.1")
        checked = len(checks.hashes)
        # WHEN the file is read again, with grafana's password changed
        fresh = web_of(certs, {**hashes, "grafana": bcrypt_hash("new")})
        keep_learnt(listener.server.web, fresh)
        listener.server.web = fresh
        # THEN prometheus, whose hash is the same, gets in with no check
        assert listener.get(tls=tls, user="prometheus", password=PASSWORD).status == 200
        assert len(checks.hashes) == checked
        # AND grafana's old password, right against its earlier hash, is checked once at no
        # cost to the spent budget, refused, and from then on refused with no check
        old = [listener.get(tls=tls, user="grafana", password="other").status for _ in range(3)]
        assert old == [401] * 3
        assert len(checks.hashes) == checked + 1


def test_a_password_hashed_anew_still_gets_in_from_a_spent_source(
    listener: Listener, certs: Certs, checks: Checks
) -> None:
    tls = client_tls(certs.ca)
    # GIVEN a scraper verified, then a guesser that spent the budget of its address
    assert listener.get(tls=tls, user="prometheus", password=PASSWORD).status == 200
    spend_budget(listener, certs, "127.0.0.1")
    # WHEN the same password is hashed anew (a new salt) and the file read again
    reload(listener, certs, {"prometheus": PASSWORD})
    # THEN the scraper gets in, checked once against the new hash, at no cost to the budget
    hashes = len(checks.hashes)
    replies = [listener.get(tls=tls, user="prometheus", password=PASSWORD) for _ in range(3)]
    assert [reply.status for reply in replies] == [200] * 3
    assert len(checks.hashes) == hashes + 1


def test_a_removed_users_password_gets_no_check_past_the_budget(
    certs: Certs, checks: Checks
) -> None:
    tls = client_tls(certs.ca)
    with listening(certs, {"prometheus": PASSWORD, "grafana": "other"}) as listener:
        # GIVEN grafana verified, then the budget of its address spent
        assert listener.get(tls=tls, user="grafana", password="other").status == 200
        spend_budget(listener, certs, "127.0.0.1")
        # WHEN grafana is removed from the file, read again
        reload(listener, certs, {"prometheus": PASSWORD})
        hashes = len(checks.hashes)
        # THEN its password is told to wait, with no check
        assert listener.get(tls=tls, user="grafana", password="other").status == 429
        assert len(checks.hashes) == hashes
