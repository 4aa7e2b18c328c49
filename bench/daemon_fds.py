"""Descriptors and unnamed processes on a node of 5,000 GPU processes, under LimitNOFILE=4096.

The daemon names each GPU process from /proc (`gpuwatch.hostinfo.HostProcessTable`,
what its NVML backend calls every second). Here /proc is a tree of 5,000 processes
built in a temporary folder (their stat and cmdline, as Linux writes them), read by
the table exactly as the daemon reads the real one, in a process whose descriptor
limit is the unit's (4096). It prints, after two samples: the descriptors open, how
many processes got no user (shown as `?`), and how many of 200 client connections
could still be made.

Run: python bench/daemon_fds.py [PROCESSES]
Before/after: run it with PYTHONPATH naming a checkout of each version.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import tempfile
from pathlib import Path

import gpuwatch
from gpuwatch.hostinfo import HostProcessTable

LIMIT_NOFILE = 4096  # systemd/gpuwatch.service
CLIENTS = 200


def fake_proc(root: Path, pids: range) -> None:
    (root / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    for pid in pids:
        process = root / str(pid)
        process.mkdir()
        rest = ["S", *["0"] * 10, "100", "0", *["0"] * 6, str(pid), "0", "1000"]
        (process / "stat").write_text(f"{pid} (python) {' '.join(rest)}\n")
        (process / "cmdline").write_text(f"python\0train.py\0--rank\0{pid}\0")


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
    with tempfile.TemporaryDirectory(prefix="gpuwatch-proc-") as work:
        root = Path(work)
        pids = range(100_000, 100_000 + processes)
        fake_proc(root, pids)
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(root / "api.sock"))
        server.listen(CLIENTS + 10)
        baseline = open_descriptors()
        table = HostProcessTable(proc=str(root))
        for _ in range(2):  # the second sample is what every later one looks like
            found = table.lookup(set(pids))
        unnamed = sum(1 for pid in pids if pid not in found or not found[pid].user)
        print(f"gpuwatch {gpuwatch.__version__} from {Path(gpuwatch.__file__).parent}")
        print(f"processes on the GPUs:        {processes}")
        print(f"descriptor limit:             {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")
        print(f"descriptors open by lookups:  {open_descriptors() - baseline}")
        print(f"processes without a user (?): {unnamed}")
        print(f"clients that could connect:   {clients_that_connect(server, CLIENTS)} of {CLIENTS}")
        table.close()


if __name__ == "__main__":
    main()
