"""HTTP basic authentication against bcrypt hashes, priced so that guessing costs the guesser.

bcrypt is slow on purpose (70 to 160 ms at cost 10, 16 times as much at 14), so a
client sending a new password with every request could spend the daemon's CPU at
no cost of its own. As Prometheus's exporter-toolkit (web/handler.go, cache.go) does:

- a verified user and password is remembered, under a keyed BLAKE2 hash of the
  user and the password (never the password itself), with the user's hash it matched,
  so that a scraper pays bcrypt once; at most `MAX_REMEMBERED`, the least recently used
  go first. A refused one is remembered apart (at most `MAX_REFUSED`, so that guesses
  never push the verified out), and refused again with no bcrypt and no budget: a
  client left with an old password costs its source's budget one check, not all;
- a reload keeps what was learnt (`keep_learnt`): the verified and refused of each user
  whose hash did not change. A password verified against a user's earlier hash (a
  rotated password, or the same one hashed anew) is checked once more at no cost to its
  source's budget: it was right once, so it is no guess;
- failed checks are counted per source address (`PasswordChecker`): `FAILURE_BURST`,
  then one more every `FAILURE_REFILL_S`; beyond that the answer is 429 with
  `Retry-After` and no bcrypt, and the listener holds that source's new connections
  unanswered for a while before closing them (a TLS handshake each would cost the
  daemon as much as the guesser). A password already verified still gets in on a
  connection already open. A password never verified before, sent from a source
  that guesses without pause, waits until the guessing stops: nothing tells it from a
  guess but bcrypt, whose time the budget is there to keep;
- bcrypt runs one check at a time, on a thread of its own at the lowest CPU priority
  (never a thread that answers, on the socket or over TCP), so that scrapes, the local
  API and the machine's other users come first; a request waits at most `CHECK_TURN_S`
  for its check (else 429 too; a password that then matches is remembered all the same);
- an unknown user is checked against a decoy hash of the users' own cost, so that
  the time of an answer does not tell which users exist.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as CheckTimeout

import bcrypt
import msgspec

log = logging.getLogger("gpuwatch.daemon")

MAX_REMEMBERED = 256
MAX_REFUSED = 1024
FAILURE_BURST = 2
FAILURE_REFILL_S = 30.0
"""A source may fail `FAILURE_BURST` checks at once, then one every this long (2 a minute):
enough for a mistyped password, and under a flood from 4 addresses the daemon spends at most
about twice the guesser's CPU (bench/abuse_endpoint.py); a budget of 5 let it spend 3 times."""
MAX_SOURCES = 4096
"""Sources whose failures are counted; beyond, those with a full budget are dropped, then the
least recently seen (which then start afresh: one check at a time still bounds the CPU)."""
CHECK_TURN_S = 2.0
LOWEST_PRIORITY = 19
CHALLENGE = ("WWW-Authenticate", 'Basic realm="gpuwatch", charset="UTF-8"')


class Verdict(msgspec.Struct, frozen=True):
    """Whether a request may pass; when not, whether to ask again later (429) or never (401)."""

    allowed: bool
    retry_after_s: int | None = None
    """Set when the password was not checked: ask again after this long."""
    reason: str = ""


ALLOWED = Verdict(True)
DENIED = Verdict(False, reason="give a user and password of the web config")


class _Bucket(msgspec.Struct):
    tokens: float
    at: float
    warned: bool = False


class PasswordChecker:
    """Runs bcrypt for a listener, within each source's budget of failed checks; kept across
    reloads, so that a new web config hands out no new budgets. Safe from many threads."""

    def __init__(
        self,
        burst: int = FAILURE_BURST,
        refill_s: float = FAILURE_REFILL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._refill_s = refill_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        self._worker = ThreadPoolExecutor(
            1, thread_name_prefix="gpuwatch-passwords", initializer=_lower_priority
        )

    def take(self, source: str) -> int | None:
        """Takes one check from `source`'s budget; `None` when taken, else the seconds until
        one is there again."""
        with self._lock:
            bucket = self._refilled(source)
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return None
            if not bucket.warned:
                bucket.warned = True
                log.warning(
                    "%s failed %d password checks; it is answered 429 until its budget refills "
                    "(one every %gs)",
                    source,
                    self._burst,
                    self._refill_s,
                )
            return max(1, math.ceil((1 - bucket.tokens) * self._refill_s))

    def spent(self, source: str) -> bool:
        """Whether `source` may fail no check now (a source never seen has its whole budget)."""
        with self._lock:
            bucket = self._buckets.get(source)
            if bucket is None:
                return False
            return bucket.tokens + (self._clock() - bucket.at) / self._refill_s < 1

    def give_back(self, source: str) -> None:
        """Returns a check taken for a password that matched, or that was never checked."""
        with self._lock:
            bucket = self._refilled(source)
            bucket.tokens = min(self._burst, bucket.tokens + 1)

    def run(self, check: Callable[[], bool], source: str) -> bool | None:
        """`check()`'s verdict, run on the checker's thread after those asked for before;
        `None` when it had none within `CHECK_TURN_S`: dropped if not begun (and the check
        taken from `source`'s budget given back), else left to end in its own time."""
        future = self._worker.submit(check)
        try:
            return future.result(timeout=CHECK_TURN_S)
        except (CheckTimeout, CancelledError):
            if future.cancel():
                self.give_back(source)
            return None

    def close(self) -> None:
        """Drops the checks not begun; the one under way ends in its own time."""
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _refilled(self, source: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.pop(source, None)
        if bucket is None:
            self._make_room(now)
            bucket = _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) / self._refill_s)
        bucket.at = now
        if bucket.tokens >= self._burst:
            bucket.warned = False
        self._buckets[source] = bucket  # last: the order is that of the latest check
        return bucket

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < MAX_SOURCES:
            return
        full_after_s = self._burst * self._refill_s
        for source, bucket in list(self._buckets.items()):
            if now - bucket.at >= full_after_s:
                del self._buckets[source]
        while len(self._buckets) >= MAX_SOURCES:
            del self._buckets[next(iter(self._buckets))]


_Learnt = tuple[str, bytes]
"""What a user and password was checked against: the user, and the hash it matched (or,
refused, the hash it did not match)."""


class _Remembered:
    """At most `limit` checks' outcomes, the least recently used going first (not locked:
    `BasicAuth` locks)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: dict[bytes, _Learnt] = {}

    def get(self, key: bytes) -> _Learnt | None:
        found = self.items.pop(key, None)
        if found is not None:
            self.items[key] = found  # the most recently used now
        return found

    def put(self, key: bytes, learnt: _Learnt) -> None:
        self.items.pop(key, None)
        self.items[key] = learnt
        while len(self.items) > self.limit:
            del self.items[next(iter(self.items))]

    def drop(self, key: bytes) -> None:
        self.items.pop(key, None)


class BasicAuth:
    """Checks `Authorization` headers against users' bcrypt hashes; safe from many threads."""

    def __init__(self, hashes: dict[str, bytes]) -> None:
        self._hashes = hashes
        cost = max((hash_cost(hashed) for hashed in hashes.values()), default=10)
        # A salt of that cost and a digest nothing hashes to: checked as slowly as a user's.
        self._decoy = bcrypt.gensalt(rounds=cost) + b"." * 31
        self._secret = os.urandom(32)
        self._verified = _Remembered(MAX_REMEMBERED)
        self._refused = _Remembered(MAX_REFUSED)
        self._lock = threading.Lock()

    def keep_learnt(self, previous: BasicAuth) -> None:
        """Takes over what `previous` (the users this replaces, on a reload) learnt: the
        verified of users still there, and the refused of users whose hash is the same
        (of unknown users too, while the decoy's cost is). Call before any check."""
        with previous._lock:
            verified = dict(previous._verified.items)
            refused = dict(previous._refused.items)
        if hash_cost(previous._decoy) == hash_cost(self._decoy):
            self._decoy = previous._decoy
        with self._lock:
            self._secret = previous._secret  # the keys learnt are keys of its secret
            for key, (user, hashed) in verified.items():
                if user in self._hashes:
                    self._verified.put(key, (user, hashed))
            for key, (user, hashed) in refused.items():
                if self._hashes.get(user, self._decoy) == hashed:
                    self._refused.put(key, (user, hashed))

    def check(self, authorization: str | None, source: str, checker: PasswordChecker) -> Verdict:
        """Whether the header holds the password of a user of the file, asked from `source`."""
        credentials = _credentials(authorization)
        if credentials is None:
            return DENIED
        user, password = credentials
        known = self._hashes.get(user)
        hashed = self._decoy if known is None else known
        key = self._key(user.encode(), password)
        with self._lock:
            verified, refused = self._verified.get(key), self._refused.get(key)
        if verified is not None and verified[1] == hashed:
            return ALLOWED
        if refused is not None and refused[1] == hashed:
            return DENIED
        # Right against this user's earlier hash: no guess, so no cost to the budget.
        free = verified is not None and known is not None
        if not free and (wait_s := checker.take(source)) is not None:
            return Verdict(False, wait_s, f"too many wrong passwords; ask again in {wait_s}s")

        def check() -> bool:  # on the checker's thread: its verdict counts, waited for or not
            matches = _checks(password, hashed) and known is not None
            if matches and not free:
                checker.give_back(source)
            self._learn(key, user, hashed, matches)
            return matches

        verdict = checker.run(check, source)
        if verdict is None:
            return Verdict(False, 1, "passwords are being checked for others; ask again in 1s")
        return ALLOWED if verdict else DENIED

    def _key(self, user: bytes, password: bytes) -> bytes:
        # The user's length first: no other user and password run together to the same bytes.
        fields = len(user).to_bytes(4, "big") + user + password
        return hashlib.blake2b(fields, key=self._secret, digest_size=32).digest()

    def _learn(self, key: bytes, user: str, hashed: bytes, matches: bool) -> None:
        with self._lock:
            if matches:
                self._verified.put(key, (user, hashed))
                self._refused.drop(key)
            else:
                self._refused.put(key, (user, hashed))
                self._verified.drop(key)  # right once, not now: no free check again


def hash_cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash `$2y$COST$...` (already checked to have that form)."""
    return int(hashed[4:6])


def _credentials(authorization: str | None) -> tuple[str, bytes] | None:
    """(user, password) from `Basic BASE64`; `None` when the header is not that."""
    scheme, _, encoded = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
        user, colon, password = decoded.partition(b":")
        return (user.decode(), password) if colon else None
    except (binascii.Error, UnicodeDecodeError):
        return None


def _lower_priority() -> None:
    """The calling thread at the lowest priority: on Linux, a thread has a nice value of its
    own (setpriority with its id); it may always be lowered."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)


def _checks(password: bytes, hashed: bytes) -> bool:
    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # over bcrypt's 72 bytes: no hash in the file can match it
        return False
