"""Scraping each node's `/metrics` directly: the fleet of a lab without Prometheus.

`--node HOST[:PORT]` (or a full `http(s)://HOST:PORT/PATH` URL) names a node; a nodes
file names one per line. A node is its URL: two URLs are two nodes, whatever names their
exporters give. Every node is read at once, all within one budget (a deadline, and bytes
for each node and for all); one that hangs, refuses, drips or sends something else is a
node that is down, with why, and never delays the others beyond the deadline.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Callable, Sequence

import msgspec
from msgspec.structs import replace

from gpuwatch.errors import InvalidValueError
from gpuwatch.fleet.exposition import Sample, parse_exposition
from gpuwatch.fleet.fetch import REFUSED, Answer, Budget, HttpOptions, Request, fetch_all
from gpuwatch.fleet.names import node_text, shown_address
from gpuwatch.fleet.series import NO_GPU_METRICS, PREFIXES, claimed, exporter_of, target_state
from gpuwatch.fleet_model import FleetState, NodeState

DEFAULT_PORT = 19400
"""The port a gpuwatch daemon serves `/metrics` on in the docs' examples (`--listen 19400`)."""
DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_STALE_AFTER_S = 15.0
"""A daemon's snapshot older than this is stale: fifteen samples at its default 1s interval,
three at a 5s one; only a daemon whose sampling stalled falls that far behind."""
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
OTHER_PORTS = "dcgm-exporter's is 9400, nvidia_gpu_exporter's 9835"


class Target(msgspec.Struct, frozen=True):
    """One node's `/metrics` URL, the host that names the node when its series do not, and
    its `HOST:PORT`, which tells it apart from every other."""

    url: str
    host: str
    label: str
    """The target as written (`node2:9400`): the name of a node that does not answer,
    which cannot name itself."""
    address: str = ""
    """`HOST:PORT` (`[fd00::1]:9400`), the port always written."""
    port_given: bool = True
    """False where the port is the default one, not written."""


def parse_target(text: str, *, https: bool = False) -> Target:
    """`HOST`, `HOST:PORT`, `[IPV6]:PORT` or `http(s)://HOST[:PORT][/PATH]`; a bare host
    takes port 19400, path `/metrics`, and `https` when asked (a CA or client
    certificate was given)."""
    shown = shown_address(text)
    if not text or not text.isprintable() or any(ch.isspace() for ch in text):
        raise InvalidValueError(f"node {shown!r}: give HOST[:PORT] or an http(s):// URL")
    bare = "://" not in text
    try:
        parts = urllib.parse.urlsplit(f"{'https' if https else 'http'}://{text}" if bare else text)
        port = parts.port
    except ValueError:  # a port that is not a number, or an IPv6 address left open
        raise InvalidValueError(
            f"node {shown!r}: give HOST[:PORT] or an http(s):// URL, with a port from 1 to "
            "65535 and an IPv6 address in brackets ([fd00::1]:9400)"
        ) from None
    host = parts.netloc.rpartition("@")[2]
    if not host.endswith("]"):
        host = host.rpartition(":")[0] if port is not None else host
    if parts.scheme not in ("http", "https") or "@" in parts.netloc or not _HOST.fullmatch(host):
        raise InvalidValueError(
            f"node {shown!r}: give HOST[:PORT] or an http(s):// URL (credentials go in "
            "a file, never in the URL)"
        )
    given = port is not None
    if port is None:
        port = DEFAULT_PORT if bare else 443 if parts.scheme == "https" else 80
    path = parts.path or "/metrics"
    query = f"?{parts.query}" if parts.query else ""
    address = f"{host}:{port}"
    url = f"{parts.scheme}://{address}{path}{query}"
    return Target(url, host.strip("[]"), text, address, given or not bare)


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
        budget: Budget | None = None,
    ) -> None:
        """`budget`: what all reads together may spend (a command's); else each read may
        spend `timeout_s`, and `max_bytes` a node."""
        if not targets:
            raise InvalidValueError("no node to read: give --node HOST or --nodes-file FILE")
        parsed = [t if isinstance(t, Target) else parse_target(t) for t in targets]
        self.targets = list({target.url: target for target in reversed(parsed)}.values())[::-1]
        """One per URL: a node named twice is read once."""
        self.options = options or HttpOptions()
        self.timeout_s, self.max_bytes, self.stale_after_s = timeout_s, max_bytes, stale_after_s
        self._clock = clock
        self._budget = budget

    @property
    def description(self) -> str:
        return f"nodes ({len(self.targets)})"

    def read(self) -> FleetState:
        """Every node now; one that cannot be read is down with why."""
        # Each node's text is parsed in its own thread as it comes: the nodes that answer
        # are ready when the last one times out. Each node may send `max_bytes`.
        budget = self._budget or Budget(self.timeout_s, self.max_bytes * len(self.targets))
        found = fetch_all(
            [Request(target.url) for target in self.targets],
            options=self.options,
            budget=budget.within(self.max_bytes),
            then=_parsed,
            headers={"Accept": "text/plain;version=0.0.4"},
        )
        now = self._clock()
        states = [self._state(t, a, s, now) for t, (a, s) in zip(self.targets, found, strict=True)]
        return FleetState(taken_at=now, source=self.description, nodes=claimed(states))

    def _state(
        self, target: Target, answer: Answer, samples: list[Sample], now: float
    ) -> NodeState:
        down = NodeState(node_text(target.label), up=False, snapshot=None, target=target.address)
        if answer.error is not None:
            return replace(down, error=self._failed(target, answer.error))
        if answer.status != 200:
            return replace(down, error=self._refused(answer.status))
        if exporter_of(samples) is None:
            return replace(down, error=NO_GPU_METRICS)
        return target_state(
            samples,
            fallback_name=target.host,
            seen_at=now,
            now=now,
            stale_after_s=self.stale_after_s,
            target=target.address,
        )

    def _failed(self, target: Target, error: str) -> str:
        """Why a node could not be read, naming the port where nobody listens on it."""
        if error != REFUSED:
            return error
        if target.port_given:
            return f"{REFUSED} at {target.address}"
        return (
            f"{REFUSED} at {target.address} (no port given: {DEFAULT_PORT} is a gpuwatch "
            f"daemon's; {OTHER_PORTS})"
        )

    def _refused(self, status: int | None) -> str:
        if status == 401 and self.options.authorization is None:
            return (
                "HTTP 401: the node asks for credentials (--user with --password-file, or "
                "--token-file)"
            )
        if status in (401, 403):
            return f"HTTP {status}: the node refuses these credentials"
        return f"HTTP {status} from its /metrics"

    def close(self) -> None:
        """Nothing stays open between reads."""


def _parsed(answer: Answer) -> tuple[Answer, list[Sample]]:
    """The answer, less its body, and the samples of the families the fleet reads."""
    if answer.error is not None or answer.status != 200:
        return answer, []
    text = answer.body.decode("utf-8", errors="replace")
    return replace(answer, body=b""), list(parse_exposition(text, PREFIXES))
