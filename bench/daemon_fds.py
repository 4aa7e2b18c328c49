"""Descriptors and unnamed processes on a node of 5,000 GPU processes, under LimitNOFILE=4096.

The daemon names each GPU process (`gpuwatch.hostinfo.HostProcessTable`, what its NVML
backend calls every second). Here 5,000 live processes of this machine (`sleep`) are
looked up by the table exactly as the daemon looks up GPU processes, in a process whose
descriptor limit is the unit's (4096). It prints, after two samples: the descriptors
open, how many processes got no user (shown as `?`), and how many of 200 client
connections could still be made.

Run: python bench/daemon_fds.py [PROCESSES]
Before/after: run it with PYTHONPATH naming a checkout of each version.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import gpuwatch
from gpuwatch.hostinfo import HostProcessTable

LIMIT_NOFILE = 4096  # systemd/gpuwatch.service
CLIENTS = 200


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def clients_that_connect(server: socket.socket, count: int) -> int:
    connected = []
    try:
        for _ in range(count):
            try:
                client = socket.socket(socket.AF_UNIX)
                connected.append(client)
                client.connect(server.getsockname())
            except OSError:
                break
        return len(connected)
    finally:
        for client in connected:
            client.close()


def main() -> None:
    processes = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LIMIT_NOFILE, hard), hard))
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(processes)]
    try:
        with tempfile.TemporaryDirectory(prefix="gpuwatch-fds-") as work:
            pids = {sleeper.pid for sleeper in sleepers}
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(Path(work) / "api.sock"))
            server.listen(CLIENTS + 10)
            baseline = open_descriptors()
            table = HostProcessTable()
            for _ in range(2):  # the second sample is what every later one looks like
                found = table.lookup(pids)
            unnamed = sum(1 for pid in pids if pid not in found or not found[pid].user)
            print(f"gpuwatch {gpuwatch.__version__} from {Path(gpuwatch.__file__).parent}")
            print(f"processes on the GPUs:        {processes}")
            print(f"descriptor limit:             {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")
            print(f"descriptors open by lookups:  {open_descriptors() - baseline}")
            print(f"processes without a user (?): {unnamed}")
            connected = clients_that_connect(server, CLIENTS)
            print(f"clients that could connect:   {connected} of {CLIENTS}")
            table.close()
            server.close()
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


if __name__ == "__main__":
    main()
