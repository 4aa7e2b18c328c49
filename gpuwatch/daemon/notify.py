"""Telling systemd how the daemon is doing (`sd_notify`), with no library.

systemd passes a datagram socket in `NOTIFY_SOCKET` to `Type=notify` services,
and `WATCHDOG_USEC` when `WatchdogSec=` is set. Without them every call here
does nothing, so the daemon runs the same outside systemd.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time


class Notifier:
    """Sends READY, WATCHDOG, RELOADING, STOPPING and STATUS to systemd."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        # An address starting with "@" is in the abstract namespace.
        self._address = "\0" + address[1:] if address and address.startswith("@") else address
        self.watchdog_interval_s = watchdog_usec / 2e6 if watchdog_usec else None
        """How often to send WATCHDOG=1 (half of WatchdogSec), or `None` when not asked."""

    @classmethod
    def from_environment(cls) -> Notifier:
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        for_us = usec is not None and usec.isdigit() and pid in (None, str(os.getpid()))
        return cls(os.environ.get("NOTIFY_SOCKET"), int(usec) if for_us and usec else None)

    def ready(self, status: str) -> None:
        self._send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def reloading(self) -> None:
        # systemd compares MONOTONIC_USEC with its CLOCK_MONOTONIC, which time.monotonic reads.
        self._send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> None:
        self._send("STOPPING=1", "STATUS=stopping")

    def status(self, text: str) -> None:
        self._send(f"STATUS={text}")

    def _send(self, *fields: str) -> None:
        if not self._address:
            return
        # OSError: systemd is gone (the machine is shutting down), so there is no one to tell.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
            sock.sendto("\n".join(fields).encode(), self._address)
