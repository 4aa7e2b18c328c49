"""Running a real `gpuwatch daemon` in tests, and talking to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.daemon.metrics import exposition
from gpuwatch.daemon.view import View
from gpuwatch.models import Lease, Snapshot
from gpuwatch.sampling.poller import PollState
from tests.helpers.wait import wait_until

SCENARIO = """
hostname = "daemon-node"
[[gpu]]
count = 3
load = "constant"
utilization_pct = 40
[[process]]
gpu = 1
pid = 4242
user = "alice"
memory = "10GiB"
"""


def get_json(socket_path: Path, path: str) -> tuple[int, Any]:
    status, body = http_get(str(socket_path), path)
    return status, json.loads(body)


@contextmanager
def answering_once(path: str, body: bytes, headers: str = "") -> Iterator[None]:
    """A stand-in daemon at `path` that answers one request with 200 and `body`: for what a
    client makes of answers no daemon of this version sends."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()

        def answer() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(4096)
                head = f"HTTP/1.1 200 OK\r\n{headers}Content-Length: {len(body)}\r\n"
                connection.sendall(f"{head}Connection: close\r\n\r\n".encode() + body)

        threading.Thread(target=answer, daemon=True).start()
        yield


@contextmanager
def running_daemon(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    scenario: str = SCENARIO,
    interval: str | None = "0.2s",
) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """A daemon over a simulated node from a scenario file; yields (process, socket, scenario)."""
    scenario_path = tmp_path / "node.toml"
    scenario_path.write_text(scenario)
    socket_path = tmp_path / "gpuwatch.sock"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "daemon",
            "--sim",
            str(scenario_path),
            "--socket",
            str(socket_path),
            *(["--interval", interval] if interval else []),
            *args,
        ],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: process.poll() is not None or get_json(socket_path, "/v1/health")[0] == 200,
            "the daemon to serve",
        )
        assert process.poll() is None, process.communicate()
        yield process, socket_path, scenario_path
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=10)


# COUNT slow clients: `[sys.executable, SLOW_CLIENTS, "unix"|"tcp", ADDRESS, COUNT]`.
SLOW_CLIENTS = str(Path(__file__).resolve().parents[2] / "bench" / "slow_clients.py")


@contextmanager
def flood(command: list[str]) -> Iterator[None]:
    """Runs `command` (SLOW_CLIENTS, as some user) until the block ends."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None and process.stdout.readline() == "flooding\n"
            yield
        finally:
            process.kill()


def scrape(
    snapshot: Snapshot | None, leases: list[Lease], sampling: bool = True
) -> dict[str, list]:
    state = PollState(snapshot, None, 0.0, 1 if snapshot else 0)
    view = View(state, None if sampling else "sampling fails", tuple(leases))
    text = exposition(view).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}
