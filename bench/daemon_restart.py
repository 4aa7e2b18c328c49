"""Jobs waiting for GPUs while the daemon restarts and hangs, measured.

A daemon serves a simulated node of HOLDERS GPUs; HOLDERS jobs hold one GPU
each, and WAITERS jobs wait in `pick --wait --timeout 120s` (every other one
with `--backend daemon`). Then the daemon is restarted (SIGTERM, a new one on
the same socket), and hung (SIGSTOP) for HANG seconds, past a client's 2 s
wait for an answer. Then the holders end, and each waiter, once it runs,
holds its GPU for a moment. Printed: how many waiters were still waiting after
the restart and after the hang (must be all), how many then got a GPU and
exited 0 (must be all), and how many times one GPU was held by two jobs at once
(must be 0).

Run: python bench/daemon_restart.py [HOLDERS] [WAITERS] [HANG]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUWATCH = [sys.executable, "-m", "gpuwatch"]


def start_daemon(work: Path, gpus: int) -> subprocess.Popen[bytes]:
    scenario = work / "node.toml"
    scenario.write_text(f'[[gpu]]\ncount = {gpus}\nload = "constant"\nutilization_pct = 10\n')
    socket_path = work / "gpuwatch.sock"
    daemon = subprocess.Popen(
        [*GPUWATCH, "daemon", "--sim", str(scenario), "--socket", str(socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(socket_path.exists, "the daemon's socket")
    return daemon


def stop(daemon: subprocess.Popen[bytes]) -> None:
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(timeout=30)


def wait_until(condition: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.05)


def pick(work: Path, *options: str, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*GPUWATCH, "pick", *options, "--", "sh", "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def overlaps(log: Path) -> int:
    """Times a GPU was started on while another job still held it."""
    holding: dict[str, int] = {}
    found = 0
    for line in log.read_text().splitlines():
        what, gpu = line.split()
        if what == "start":
            found += holding.get(gpu, 0) > 0
            holding[gpu] = holding.get(gpu, 0) + 1
        else:
            holding[gpu] -= 1
    return found


def main() -> None:
    holders = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    waiters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    hang_s = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-restart-"))
    os.environ.update(
        GPUWATCH_LEASE_DIR=str(work / "leases"), GPUWATCH_SOCKET=str(work / "gpuwatch.sock")
    )
    for name in ("GPUWATCH_SIM", "GPUWATCH_BACKEND"):
        os.environ.pop(name, None)
    log, go = work / "log", work / "go"
    daemon = start_daemon(work, holders)
    hold = f"while [ ! -e {go} ]; do sleep 0.05; done"
    started = [pick(work, script=f"touch {work}/held-$$; {hold}") for _ in range(holders)]
    wait_until(lambda: len(list(work.glob("held-*"))) == holders, "the holders")
    job = (
        f'echo start "$CUDA_VISIBLE_DEVICES" >> {log}; sleep 0.2; '
        f'echo end "$CUDA_VISIBLE_DEVICES" >> {log}'
    )
    waiting = [
        pick(
            work,
            "--wait",
            "--timeout",
            "120s",
            *(["--backend", "daemon"] if n % 2 else []),
            script=job,
        )
        for n in range(waiters)
    ]
    wait_until(
        lambda: len(list((work / "leases").glob("*.wait"))) == waiters, "the waiters to queue"
    )
    try:
        stop(daemon)
        time.sleep(1.0)  # no daemon (and no driver here) for a while
        daemon = start_daemon(work, holders)
        time.sleep(1.0)
        after_restart = sum(w.poll() is None for w in waiting)
        daemon.send_signal(signal.SIGSTOP)
        time.sleep(hang_s)
        after_hang = sum(w.poll() is None for w in waiting)
        daemon.send_signal(signal.SIGCONT)
        go.touch()
        codes = [w.wait(timeout=180) for w in waiting]
    finally:
        daemon.send_signal(signal.SIGCONT)
        stop(daemon)
        for process in started + waiting:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    served = log.read_text().count("start") if log.exists() else 0
    print(f"{holders} holders, {waiters} waiters ({waiters // 2} with --backend daemon)")
    print(f"waiting after the daemon restarted:   {after_restart}/{waiters}")
    print(f"waiting after it hung {hang_s:g}s (SIGSTOP): {after_hang}/{waiters}")
    print(f"got a GPU and exited 0:               {codes.count(0)}/{waiters} (served {served})")
    print(f"a GPU held by two jobs at once:       {overlaps(log) if log.exists() else 0} times")


if __name__ == "__main__":
    main()
