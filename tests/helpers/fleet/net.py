"""Loopback plumbing shared by the fleet's harness: a free port, a forgiving GET."""

from __future__ import annotations

import socket
import urllib.request


def fetch(url: str, timeout_s: float) -> bytes:
    """The body of `url`, or b"" when it cannot be read (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bytes(response.read())
    except OSError:
        return b""


def free_port() -> int:
    """A loopback port free now (another process may take it before it is used: callers
    that bind it later retry)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
