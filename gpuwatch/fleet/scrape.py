"""Scraping each node's `/metrics` directly: the fleet of a lab without Prometheus.

`--node HOST[:PORT]` (or a full `http(s)://HOST:PORT/PATH` URL) names a node; a nodes
file names one per line. Every node is read at once, each within its own timeout and
byte cap; one that hangs, refuses, drips or sends something else is a node that is
down, with why, and never delays the others beyond its own timeout.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpuwatch.errors import InvalidValueError
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.fetch import Answer, Budget, HttpOptions, Request, fetch_all
from gpuwatch.fleet.series import (
    NO_GPU_METRICS,
    PREFIXES,
    exporter_of,
    merged,
    safe_name,
    shown_address,
    target_state,
)
from gpuwatch.fleet_model import FleetState, NodeState

DEFAULT_PORT = 19400
"""The port a gpuwatch daemon serves `/metrics` on in the docs' examples (`--listen 19400`)."""
DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_STALE_AFTER_S = 15.0
"""A daemon's snapshot older than this is stale: fifteen samples at its default 1s interval,
three at a 5s one; only a daemon whose sampling stalled falls that far behind."""
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")


@dataclass(frozen=True, slots=True)
class Target:
    """One node's `/metrics` URL, and the host that names the node when its series do not."""

    url: str
    host: str
    label: str
    """The target as written (`node2:9400`): the name of a node that does not answer,
    which cannot name itself."""


def parse_target(text: str, *, https: bool = False) -> Target:
    """`HOST`, `HOST:PORT`, `[IPV6]:PORT` or `http(s)://HOST[:PORT][/PATH]`; a bare host
    takes port 19400, path `/metrics`, and `https` when asked (a CA or client
    certificate was given)."""
    shown = shown_address(text)
    if not text or not text.isprintable() or any(ch.isspace() for ch in text):
        raise InvalidValueError(f"node {shown!r}: give HOST[:PORT] or an http(s):// URL")
    bare = "://" not in text
    parts = urllib.parse.urlsplit(f"{'https' if https else 'http'}://{text}" if bare else text)
    try:
        port = parts.port
    except ValueError:
        raise InvalidValueError(
            f"node {shown!r}: the port is not a number from 1 to 65535"
        ) from None
    host = parts.netloc.rpartition("@")[2]
    if not host.endswith("]"):
        host = host.rpartition(":")[0] if port is not None else host
    if parts.scheme not in ("http", "https") or "@" in parts.netloc or not _HOST.fullmatch(host):
        raise InvalidValueError(
            f"node {shown!r}: give HOST[:PORT] or an http(s):// URL (credentials go in "
            "a file, never in the URL)"
        )
    if port is None:
        port = DEFAULT_PORT if bare else 443 if parts.scheme == "https" else 80
    path = parts.path or "/metrics"
    query = f"?{parts.query}" if parts.query else ""
    label = text
    return Target(f"{parts.scheme}://{host}:{port}{path}{query}", host.strip("[]"), label)


class ScrapeSource:
    """A fleet read by GETting every node's `/metrics` at once.

    >>> source = ScrapeSource([parse_target("node1"), parse_target("node2:9400")])
    >>> source.description
    'nodes (2)'
    """

    def __init__(
        self,
        targets: Sequence[Target | str],
        *,
        options: HttpOptions | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not targets:
            raise InvalidValueError("no node to read: give --node HOST or --nodes-file FILE")
        self.targets = [t if isinstance(t, Target) else parse_target(t) for t in targets]
        self.options = options or HttpOptions()
        self.timeout_s, self.max_bytes, self.stale_after_s = timeout_s, max_bytes, stale_after_s
        self._clock = clock

    @property
    def description(self) -> str:
        return f"nodes ({len(self.targets)})"

    def read(self) -> FleetState:
        """Every node now; one that cannot be read is down with why."""
        # Each node's text is parsed in its own thread as it comes: the nodes that answer
        # are ready when the last one times out. Each node may send `max_bytes`.
        budget = Budget(
            self.timeout_s, self.max_bytes * len(self.targets), answer_bytes=self.max_bytes
        )
        found = fetch_all(
            [Request(target.url) for target in self.targets],
            options=self.options,
            budget=budget,
            then=_parsed,
            headers={"Accept": "text/plain;version=0.0.4"},
        )
        now = self._clock()
        states = [self._state(t, a, s, now) for t, (a, s) in zip(self.targets, found, strict=True)]
        return FleetState(taken_at=now, source=self.description, nodes=merged(states))

    def _state(
        self, target: Target, answer: Answer, samples: list[Sample], now: float
    ) -> NodeState:
        down = safe_name(target.label)
        if answer.error is not None:
            return NodeState(down, up=False, snapshot=None, error=answer.error)
        if answer.status != 200:
            return NodeState(down, up=False, snapshot=None, error=_status(answer.status))
        if exporter_of(samples) is None:
            return NodeState(down, up=False, snapshot=None, error=NO_GPU_METRICS)
        return target_state(
            samples,
            fallback_name=safe_name(target.host),
            seen_at=now,
            now=now,
            stale_after_s=self.stale_after_s,
        )

    def close(self) -> None:
        """Nothing stays open between reads."""


def _parsed(answer: Answer) -> tuple[Answer, list[Sample]]:
    """The answer, less its body, and the samples of the families the fleet reads."""
    if answer.error is not None or answer.status != 200:
        return answer, []
    text = answer.body.decode("utf-8", errors="replace")
    return replace(answer, body=b""), list(parse_exposition(text, PREFIXES))


def _status(status: int | None) -> str:
    if status in (401, 403):
        return f"HTTP {status}: the node refuses these credentials"
    return f"HTTP {status} from its /metrics"
