"""The daemon backend: snapshots from a running `gpuwatch daemon`, over its Unix socket.

A client that finds the daemon starts no driver and makes no NVML call; the
snapshot is at most one sampling interval old. The HTTP spoken here is the
least that works (one GET, HTTP/1.0, read to the end): `http.client` would
cost `gpuwatch pick` more start-up time than the whole request. For the same
reason it uses `_socket`: the `socket` module's wrapper builds enums of every
constant on import, which costs more than the request.
"""

from __future__ import annotations

import _socket
import json
import os
import stat

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.models import Snapshot
from gpuwatch.paths import socket_candidates

TIMEOUT_S = 2.0
_MAX_RESPONSE_BYTES = 64 << 20


def http_get(socket_path: str, path: str, timeout_s: float = TIMEOUT_S) -> tuple[int, bytes]:
    """GETs `path` from the daemon at `socket_path`: (status, body)."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connection.settimeout(timeout_s)
        connection.connect(socket_path)
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: gpuwatch\r\n\r\n".encode())
        chunks, size = [], 0
        while chunk := connection.recv(1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_RESPONSE_BYTES:
                raise ValueError("response too large")
    finally:
        connection.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
        raise ValueError("not an HTTP response")
    return int(status_line[1]), body


class DaemonBackend(Backend):
    """Reads snapshots from the daemon; raises `DaemonUnavailableError` when none answers."""

    name = "daemon"

    def __init__(self, socket_path: str | None = None, *, timeout_s: float = TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        failures = []
        for path in [socket_path] if socket_path else socket_candidates():
            try:
                self._pending: Snapshot | None = self._fetch(path)
            except DaemonUnavailableError as error:
                failures.append(str(error))
                continue
            self.socket_path = path
            return
        raise DaemonUnavailableError("; ".join(failures))

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        """The daemon's latest snapshot (always in full, whatever the scope)."""
        if (pending := self._pending) is not None:
            self._pending = None  # the one fetched while connecting
            return pending
        return self._fetch(self.socket_path)

    def close(self) -> None:
        pass

    def _fetch(self, path: str) -> Snapshot:
        try:
            _check_owner(path)
            status, body = http_get(path, "/v1/snapshot", self._timeout_s)
            if status != 200:
                raise DaemonUnavailableError(
                    f"the daemon at {path} has no snapshot yet (HTTP {status})"
                )
            return Snapshot.from_dict(json.loads(body))
        except FileNotFoundError:
            raise DaemonUnavailableError(f"no daemon socket at {path}") from None
        except ConnectionRefusedError:
            raise DaemonUnavailableError(f"{path} is stale: no daemon listens on it") from None
        except TimeoutError:
            raise DaemonUnavailableError(
                f"the daemon at {path} did not answer in {self._timeout_s:g}s"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DaemonUnavailableError(f"the daemon at {path} failed: {error}") from None


def _check_owner(path: str) -> None:
    """Trusts a socket made by root, by this user, or by the owner of its directory.

    /run/gpuwatch is writable by every user (leases live there), so while the
    daemon is down anyone could plant a socket at its place and answer in its
    name; the daemon's socket belongs to the daemon, which owns the directory.
    """
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise DaemonUnavailableError(f"{path} is not a socket")
    directory_owner = os.stat(os.path.dirname(os.path.abspath(path))).st_uid
    if info.st_uid not in (0, os.getuid(), directory_owner):
        raise DaemonUnavailableError(
            f"{path} belongs to uid {info.st_uid}, not to the daemon: ignored"
        )
