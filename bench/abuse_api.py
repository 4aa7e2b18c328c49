"""Slow clients against the daemon's API: does everyone else still get answers?

A daemon over a simulated 8-GPU node serves its socket and /metrics over TCP.
Another local user holds 130 connections to the socket, and 130 more come over
TCP from another address (127.0.0.2), each sending one byte every 2 s and
coming back as soon as it is let go. Meanwhile this user runs
`gpuwatch status --backend daemon` (timed, start-up included) and Prometheus
scrapes /metrics 10 times.

Run as root (to play the other user with setpriv): python bench/abuse_api.py
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SLOW_CLIENTS = 130
SCRAPES = 10
RUNS = 5
FLOODER = "gpuwatch-bench"
SLOW_CLIENT_SCRIPT = str(Path(__file__).resolve().with_name("slow_clients.py"))


def as_flooder(command: list[str]) -> list[str]:
    """`command` as another local user, made if needed; as this one where that cannot be."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("  (not root: the socket flood comes from this user, who then is refused too)")
        return command
    try:
        entry = pwd.getpwnam(FLOODER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FLOODER],
            check=True,
        )
        entry = pwd.getpwnam(FLOODER)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        *command,
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"the daemon did not start: no {path}")
        time.sleep(0.1)


def status_seconds(env: dict[str, str]) -> list[float]:
    """Wall times of `gpuwatch status --backend daemon`; inf for a run that failed."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "status", "--backend", "daemon"],
            env=env,
            capture_output=True,
            check=False,
            timeout=60,
        )
        elapsed = time.perf_counter() - start
        times.append(elapsed if done.returncode == 0 else float("inf"))  # refused
    return times


def scrapes_answered(port: int) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answered = 0
    for _ in range(SCRAPES):
        try:
            with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
                answered += reply.status == 200 and b"gpuwatch_gpu_up" in reply.read()
        except OSError:
            pass
    return answered


def report(label: str, env: dict[str, str], port: int) -> None:
    times = status_seconds(env)
    print(
        f"{label}: gpuwatch status --backend daemon answered in {max(times):.2f} s at worst, "
        f"{statistics.median(times):.2f} s median ({RUNS} runs); "
        f"Prometheus scrapes answered: {scrapes_answered(port)} of {SCRAPES}"
    )


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-abuse-"))
    work.chmod(0o755)  # the other user must reach the socket
    sock, port = work / "gpuwatch.sock", free_port()
    env = {**os.environ, "GPUWATCH_SOCKET": str(sock)}
    serve = ["daemon", "--sim", "8", "--socket", str(sock), "--listen", str(port)]
    daemon = subprocess.Popen([sys.executable, "-m", "gpuwatch", *serve], stderr=subprocess.DEVNULL)
    floods: list[subprocess.Popen[str]] = []
    try:
        wait_for(sock)
        report("quiet", env, port)
        for command in (
            as_flooder([sys.executable, SLOW_CLIENT_SCRIPT, "unix", str(sock), str(SLOW_CLIENTS)]),
            [sys.executable, SLOW_CLIENT_SCRIPT, "tcp", str(port), str(SLOW_CLIENTS)],
        ):
            flood = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            floods.append(flood)
            assert flood.stdout is not None and flood.stdout.readline() == "flooding\n"
        # Past the 5 s a request may take: the first slow clients have been let go and are back.
        time.sleep(7)
        report(
            f"with {SLOW_CLIENTS} slow clients on the socket and {SLOW_CLIENTS} over TCP", env, port
        )
        return 0
    finally:
        for flood in floods:
            flood.kill()
            flood.communicate()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
