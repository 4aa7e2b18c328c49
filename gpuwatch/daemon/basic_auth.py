"""HTTP basic authentication against bcrypt hashes, as Prometheus's exporters do it.

bcrypt is slow on purpose (70 ms at cost 10, far more at higher costs), and
Prometheus sends the same credentials with every scrape: each verdict is kept
in memory, for the life of the process, under a SHA-256 of the user, password
and hash (never the password itself), so that a scrape a second costs one
bcrypt in all. An unknown user costs a bcrypt (of cost 10) as a known one does, so that the time
of an answer does not tell which users exist. The cache is bounded: a client
trying passwords one after another fills it, and the oldest verdicts go first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading

import bcrypt

MAX_VERDICTS = 1024
CHALLENGE = ("WWW-Authenticate", 'Basic realm="gpuwatch", charset="UTF-8"')
# Compared against when the user is unknown: as slow as a real hash of cost 10.
_DECOY = b"$2b$10$L5oO9dLeBtK0nWn6b4GyUuS3kXcZo0E0QmO8Jc7H4pV6G6aVqO1Ry"


class BasicAuth:
    """Checks `Authorization` headers against users' bcrypt hashes; safe from many threads."""

    def __init__(self, hashes: dict[str, bytes]) -> None:
        self._hashes = hashes
        self._verdicts: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    def allows(self, authorization: str | None) -> bool:
        """Whether the header holds the password of a user of the file."""
        credentials = _credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        known = self._hashes.get(user)
        hashed = known if known is not None else _DECOY
        key = hashlib.sha256(b"\0".join((user.encode(), password, hashed))).digest()
        with self._lock:
            verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = _checks(password, hashed) and known is not None
            with self._lock:
                if len(self._verdicts) >= MAX_VERDICTS:
                    del self._verdicts[next(iter(self._verdicts))]
                self._verdicts[key] = verdict
        return verdict


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


def _checks(password: bytes, hashed: bytes) -> bool:
    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:  # over bcrypt's 72 bytes: no hash in the file can match it
        return False
