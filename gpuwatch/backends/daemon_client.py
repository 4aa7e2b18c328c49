"""The daemon backend: snapshots from a running `gpuwatch daemon`, over its Unix socket.

A client that finds the daemon starts no driver and makes no NVML call; the
snapshot is at most one sampling interval old, and one older than the daemon
says it may be (`X-Gpuwatch-Stale-After`, seconds) is refused, so that a
daemon that stopped sampling is never taken for a current view. The HTTP
spoken here is the least that works (one GET, HTTP/1.0, read to the end):
`http.client` would add its imports (the `email` package's parser among them),
about 25 ms by `python -X importtime` on a loaded 2-core machine, to every
`gpuwatch pick` and `gpuwatch status`, for a request that takes about 1 ms.
"""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import time
from typing import Any

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import SNAPSHOT_FORMAT_VERSION, Snapshot
from gpuwatch.paths import served_simulation, socket_candidates

TIMEOUT_S = 2.0
STALE_AFTER_HEADER = "x-gpuwatch-stale-after"
DEFAULT_STALE_AFTER_S = 10.0
"""How old a snapshot may be when the daemon does not say (an older daemon)."""
_MAX_RESPONSE_BYTES = 64 << 20


def http_get(socket_path: str, path: str, timeout_s: float = TIMEOUT_S) -> tuple[int, bytes]:
    """GETs `path` from the daemon at `socket_path`: (status, body)."""
    status, _, body = http_request(socket_path, path, timeout_s)
    return status, body


def http_request(
    socket_path: str, path: str, timeout_s: float = TIMEOUT_S
) -> tuple[int, dict[str, str], bytes]:
    """GETs `path` from the daemon at `socket_path`: (status, headers in lower case, body)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    words = status_line.split()
    if len(words) < 2 or not words[0].startswith("HTTP/"):
        raise ValueError("not an HTTP response")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(words[1]), headers, body


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
            if self._pending.simulated:
                self.simulation = served_simulation(path)
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

    def recent_utilization_pct(self, window_s: float) -> dict[str, float]:
        """From the daemon's history (`/v1/history`); empty when it cannot answer."""
        try:
            _check_owner(self.socket_path)
            status, _, body = http_request(
                self.socket_path, f"/v1/history?last={window_s:g}s", self._timeout_s
            )
            return peak_utilization(json.loads(body)) if status == 200 else {}
        except (OSError, ValueError, DaemonUnavailableError):
            return {}

    def history(self, window_s: float) -> list[GpuSeries]:
        """The daemon's per-GPU history of the last `window_s` (`/v1/history`), checked
        field by field; `OSError`, `ValueError` or `DaemonUnavailableError` when it cannot
        answer."""
        _check_owner(self.socket_path)
        return fetch_history(self.socket_path, window_s, self._timeout_s)

    def jobs_record(self) -> dict[str, Any] | None:
        """The daemon's `/v1/jobs` (see `fetch_jobs_record`)."""
        return fetch_jobs_record(self.socket_path, self._timeout_s)

    def _fetch(self, path: str) -> Snapshot:
        try:
            _check_owner(path)
            status, headers, body = http_request(path, "/v1/snapshot", self._timeout_s)
            if status != 200:
                raise DaemonUnavailableError(
                    f"the daemon at {path} has no current snapshot (HTTP {status}: "
                    f"{_error_of(body)})"
                )
            return _current(Snapshot.from_dict(_readable(json.loads(body))), headers, path)
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


def fetch_jobs_record(socket_path: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any] | None:
    """The `/v1/jobs` of the daemon at `socket_path`: who holds each GPU, as
    `gpuwatch.jobs.table_record` writes it, with `allocated_idle_s` and `idle_window_s`;
    `None` from a daemon without the route (an older one). Fields are left to the caller to
    check; `OSError`, `ValueError` or `DaemonUnavailableError` when it cannot answer."""
    _check_owner(socket_path)
    status, body = http_get(socket_path, "/v1/jobs", timeout_s)
    if status == 404:
        return None
    if status != 200:
        raise ValueError(f"HTTP {status}: {_error_of(body)}")
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("the jobs answer is not a JSON object")
    return data


def _current(snapshot: Snapshot, headers: dict[str, str], path: str) -> Snapshot:
    """`snapshot`, unless it is older than the daemon itself would serve."""
    try:
        stale_after_s = float(headers.get(STALE_AFTER_HEADER, DEFAULT_STALE_AFTER_S))
    except ValueError:
        stale_after_s = DEFAULT_STALE_AFTER_S
    age_s = time.time() - snapshot.taken_at
    if not age_s <= max(stale_after_s, DEFAULT_STALE_AFTER_S):  # NaN too
        raise DaemonUnavailableError(
            f"the daemon at {path} serves a snapshot {age_s:.0f}s old: it no longer samples"
        )
    return snapshot


def _readable(data: object) -> dict[str, Any]:
    """`data`, when it is a snapshot in the format this client reads (an older daemon's
    has no `format_version`: the first)."""
    if not isinstance(data, dict):
        raise ValueError("the snapshot is not a JSON object")
    version = data.get("format_version", 1)
    if version != SNAPSHOT_FORMAT_VERSION:
        raise ValueError(
            f"it sends snapshots in format {version!r}, and this gpuwatch reads format "
            f"{SNAPSHOT_FORMAT_VERSION}: run the same version of both"
        )
    return data


def peak_utilization(history: object) -> dict[str, float]:
    """The highest utilization of each GPU in a `/v1/history` answer, by UUID: what is not a
    GPU series with a UUID and percentages is passed over."""
    gpus = history.get("gpus") if isinstance(history, dict) else None
    peaks: dict[str, float] = {}
    for series in gpus if isinstance(gpus, list) else ():
        if not isinstance(series, dict) or not isinstance(uuid := series.get("uuid"), str):
            continue
        values = series.get("utilization_pct")
        known = [
            value
            for value in (values if isinstance(values, list) else ())
            if type(value) is int and 0 <= value <= 100
        ]
        if known:
            peaks[uuid] = float(max(known))
    return peaks


def fetch_history(
    socket_path: str, window_s: float, timeout_s: float = TIMEOUT_S
) -> list[GpuSeries]:
    """The per-GPU history for the last `window_s` of the daemon at `socket_path`."""
    status, body = http_get(socket_path, f"/v1/history?last={window_s:g}", timeout_s)
    if status != 200:
        raise ValueError(f"HTTP {status}")
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("not a history answer")
    return [series for item in data["gpus"] if (series := parse_series(item)) is not None]


def parse_series(item: object) -> GpuSeries | None:
    """A `GpuSeries` from the daemon's JSON, or `None` when anything is off."""
    if not isinstance(item, dict):
        return None
    index, times = item.get("index"), item.get("taken_at")
    memory, utilization = item.get("memory_used_bytes"), item.get("utilization_pct")
    if not (isinstance(index, int) and 0 <= index < 1024):
        return None
    columns = (times, memory, utilization)
    if not all(isinstance(column, list) for column in columns):
        return None
    assert isinstance(times, list) and isinstance(memory, list) and isinstance(utilization, list)
    if not len(times) == len(memory) == len(utilization):
        return None
    if not all(_finite(t) for t in times):
        return None
    uuid = item.get("uuid")
    return GpuSeries(
        index=index,
        uuid=uuid if isinstance(uuid, str) else None,
        taken_at=[float(t) for t in times],
        memory_used_bytes=[_int_or_none(v, 1 << 50) for v in memory],
        utilization_pct=[_int_or_none(v, 100) for v in utilization],
        temperature_c=[None] * len(times),
        power_w=[None] * len(times),
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_or_none(value: object, maximum: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum:
        return value
    return None


def _error_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])[:200]
    except (ValueError, KeyError, TypeError):
        return "no reason given"


def _check_owner(path: str) -> None:
    """Trusts a socket made by root, by this user, or by a user root gave its directory to.

    While a daemon is down, anyone who can write its directory could plant a
    socket there and answer in its name. The system's directory belongs to the
    daemon's user, and only root could have given it to them (its parent is
    root's and only root may write there); `/tmp/gpuwatch-UID`, made by whoever
    came first, is no such place.
    """
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise DaemonUnavailableError(f"{path} is not a socket")
    if info.st_uid in (0, os.getuid()) or info.st_uid == _owner_placed_by_root(path):
        return
    raise DaemonUnavailableError(f"{path} belongs to uid {info.st_uid}, not to the daemon: ignored")


def _owner_placed_by_root(path: str) -> int | None:
    directory = os.path.dirname(os.path.abspath(path))
    owner = os.stat(directory).st_uid
    parent = os.stat(os.path.dirname(directory))
    return owner if parent.st_uid == 0 and not parent.st_mode & 0o022 else None
