"""What another local user can do to the lease directory, measured.

1. Another user (`nobody`, through setpriv, when run as root; else another
   process of this user) takes the directory lock and keeps it: how long
   `gpuwatch pick --timeout 3s` takes to give up (it must within 4s).
2. 1000 random lease and ticket files, held as live holders hold them, in
   rounds of 20: the tracebacks and non-JSON answers of `status` (table and
   --json), `pick --mem` and a daemon's /v1/leases and /metrics (must be 0).

Run: python bench/abuse_leases.py [FILES]
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuwatch.backends.daemon_client import http_get

GPUWATCH = [sys.executable, "-m", "gpuwatch"]
ROUND_FILES = 20
LONGEST_WAIT_S = 60
EXTREMES: list[Any] = [
    10**400,
    -(10**400),
    2**63,
    1e300,
    -1e300,
    float("nan"),
    float("inf"),
    -1,
    0,
    True,
    None,
    "",
    "x" * 5000,
    [],
    {},
]


def main() -> None:
    files = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-abuse-"))
    work.chmod(0o755)
    lease_dir = work / "leases"
    lease_dir.mkdir(mode=0o1777)
    lease_dir.chmod(0o1777)
    env = {**os.environ, "GPUWATCH_LEASE_DIR": str(lease_dir), "GPUWATCH_DEBUG": "1"}
    for name in ("GPUWATCH_SIM", "GPUWATCH_BACKEND", "CUDA_VISIBLE_DEVICES"):
        env.pop(name, None)
    try:
        held_lock(lease_dir, env)
        random_files(files, work, lease_dir, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def held_lock(lease_dir: Path, env: dict[str, str]) -> None:
    ready = lease_dir / "ready"
    holder_argv = ["flock", str(lease_dir), "sh", "-c", f"touch {ready}; exec sleep 600"]
    who = "another process of this user"
    if os.geteuid() == 0 and shutil.which("setpriv"):
        nobody = pwd.getpwnam("nobody")
        holder_argv = [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            "--",
            *holder_argv,
        ]
        who = "another user (nobody)"
    holder = subprocess.Popen(holder_argv, start_new_session=True)
    try:
        while not ready.exists():
            time.sleep(0.01)
        start = time.perf_counter()
        try:
            pick = subprocess.run(
                [*GPUWATCH, "pick", "--sim", "2", "--timeout", "3s"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=LONGEST_WAIT_S,
            )
        except subprocess.TimeoutExpired:
            print(f"directory lock held by {who}: pick --timeout 3s still waiting after 60s")
            return
        took_s = time.perf_counter() - start
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        ready.unlink()
    verdict = "ok" if took_s < 4 else "TOO SLOW"
    print(f"directory lock held by {who}: pick --timeout 3s returned in {took_s:.2f}s ({verdict})")
    message = (pick.stderr.strip() or "(no message)").splitlines()[0]
    print(f"  exit code {pick.returncode}: {message}")


def random_files(count: int, work: Path, lease_dir: Path, env: dict[str, str]) -> None:
    rng = random.Random(20261122)
    daemon, sock = start_daemon(work, env)
    tracebacks = non_json = answers = 0
    try:
        for first in range(0, count, ROUND_FILES):
            for path in lease_dir.iterdir():
                path.unlink()
            size = min(ROUND_FILES, count - first)
            held = plant(lease_dir, [random_file(rng) for _ in range(size)])
            try:
                outputs = [
                    run(env, "status", "--sim", "2"),
                    run(env, "pick", "--sim", "2", "--mem", "1GiB"),
                ]
                as_json = run(env, "status", "--sim", "2", "--json")
                leases = daemon_answer(sock, "/v1/leases")
                metrics = daemon_answer(sock, "/metrics")
            finally:
                for fd in held:
                    os.close(fd)
            tracebacks += sum("Traceback" in stderr for _, stderr in [*outputs, as_json])
            non_json += (not is_strict_json(as_json[0])) + (not is_strict_json(leases))
            non_json += metrics is None
            answers += 5
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=30)
    print(f"{count} random lease/ticket files, {answers} answers read:")
    print(f"  tracebacks: {tracebacks}")
    print(f"  non-JSON answers (status --json, /v1/leases) or failed /metrics: {non_json}")


def random_file(rng: random.Random) -> tuple[str, bytes]:
    """A held file as another user may write it: mostly a plausible record with one field
    out of range, sometimes several, sometimes not JSON at all."""
    stem = f"{rng.randrange(10**20):020d}-{os.getpid()}-{rng.randrange(16**8):08x}"
    if rng.random() < 0.1:
        stem = "".join(rng.choice("0123456789abcdef-") for _ in range(rng.randrange(1, 30)))
    kind = rng.choice(["lease", "wait"])
    if rng.random() < 0.1:
        return f"{stem}.{kind}", rng.randbytes(rng.randrange(64))
    if kind == "lease":
        record = {
            "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "gpu_index": rng.randrange(2),
            "pid": os.getpid(),
            "command": "python train.py",
            "started_at": time.time(),
            "mem_bytes": rng.choice([None, 1 << 30]),
        }
        record = spoiled(rng, record)
    else:
        request = spoiled(rng, {"count": rng.randrange(1, 3), "max_util_pct": 50.0})
        record = spoiled(rng, {"pid": os.getpid(), "request": request})
    return f"{stem}.{kind}", json.dumps(record).encode()


def spoiled(rng: random.Random, record: dict[str, Any]) -> dict[str, Any]:
    """`record` with one field (or, one time in five, any field) set to an extreme value."""
    if rng.random() < 0.8:
        return {**record, rng.choice(list(record)): rng.choice(EXTREMES)}
    return {k: rng.choice(EXTREMES) if rng.random() < 0.3 else v for k, v in record.items()}


def plant(lease_dir: Path, files: list[tuple[str, bytes]]) -> list[int]:
    held = []
    for name, content in dict(files).items():
        path = lease_dir / name
        path.write_bytes(content)
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    return held


def run(env: dict[str, str], *args: str) -> tuple[str, str]:
    done = subprocess.run([*GPUWATCH, *args], env=env, capture_output=True, text=True, check=False)
    return done.stdout, done.stderr


def daemon_answer(sock: Path, path: str) -> str | None:
    """The body of a 200 answer; `None` for an error or a connection closed unanswered."""
    try:
        status, body = http_get(str(sock), path)
    except (OSError, ValueError):
        return None
    return body.decode() if status == 200 else None


def is_strict_json(text: str | None) -> bool:
    def refuse(constant: str) -> None:
        raise ValueError(constant)

    try:
        json.loads(text or "", parse_constant=refuse)
    except ValueError:
        return False
    return True


def start_daemon(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    sock = work / "gpuwatch.sock"
    daemon = subprocess.Popen(
        [*GPUWATCH, "daemon", "--sim", "2", "--socket", str(sock), "--interval", "0.5s"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if http_get(str(sock), "/v1/health")[0] == 200:
                return daemon, sock
        except OSError:
            pass
        if daemon.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the daemon did not start: {daemon.communicate()[1]}")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
