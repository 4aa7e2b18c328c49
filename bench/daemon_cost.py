"""What the daemon costs the machine, and what it saves `gpuwatch pick`.

- CPU (% of one core) and RSS of `gpuwatch daemon` sampling at 1 Hz, over SECONDS (default
  60), on a simulated 8-GPU node with 100 GPU processes that are real processes of this
  machine (so /proc is read for each), through ../shared/fakenvml; beside `nvitop-exporter`
  at the same interval on the same node, when it is installed in $FAKENVML_VENV.
- `gpuwatch pick -n 1 -- true` (the node has one idle GPU) with the daemon up, beside the
  same without it and a bare `python -c pass`.
- The memory of 24 h of history at 1 Hz for 8 GPUs: stated, and measured with tracemalloc.

Run: python bench/daemon_cost.py [SECONDS]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from _common import NODE_8GPU, build_fakenvml, fakenvml_env, median_wall_ms, tool

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.sampling.history import History, history_bytes

PYTHON = sys.executable
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
TICKS = os.sysconf("SC_CLK_TCK")
PROCESSES = 100


def scenario_with_live_processes(work: Path, pids: list[int]) -> Path:
    """node-8gpu.txt's GPUs, with 100 processes spread over them, each a live pid here."""
    gpus = [line for line in NODE_8GPU.read_text().splitlines() if line.startswith("gpu ")]
    gpus = [re.sub(r" used=\S+", "", line) for line in gpus]  # used = the sum of the processes
    procs = [
        f"proc gpu={n % 8} pid={pid} used={512 + 64 * (n % 16)}MiB kind=compute sm=5 mem=2"
        for n, pid in enumerate(pids)
    ]
    path = work / "node-100proc.txt"
    path.write_text("driver 580.95.05\ncuda 13000\n" + "\n".join(gpus + procs) + "\n")
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


def measure(
    name: str, argv: list[str], env: dict[str, str], seconds: float, ready: callable
) -> tuple[float, float]:  # type: ignore[valid-type]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready():
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"{name} did not start")
            time.sleep(0.1)
        time.sleep(3)  # past start-up: measure the steady state
        start_cpu, start = cpu_seconds(process.pid), time.monotonic()
        time.sleep(seconds)
        used = cpu_seconds(process.pid) - start_cpu
        return 100 * used / (time.monotonic() - start), rss_mb(process.pid)
    finally:
        process.terminate()
        process.wait()


def answers(socket_path: str) -> bool:
    try:
        return http_get(socket_path, "/v1/health")[0] == 200
    except OSError:
        return False


def serves_metrics(port: int) -> bool:
    import urllib.request

    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=2):
            return True
    except OSError:
        return False


def daemon_cost(library: Path, seconds: float) -> None:
    work = Path(tempfile.mkdtemp())
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(PROCESSES)]
    try:
        scenario = scenario_with_live_processes(work, [s.pid for s in sleepers])
        env = fakenvml_env(library, scenario, GPUWATCH_LEASE_DIR=str(work / "leases"))
        socket_path = str(work / "gpuwatch.sock")
        ours = measure(
            "gpuwatch daemon",
            [GPUWATCH, "daemon", "--backend", "nvml", "--socket", socket_path, "--interval", "1s"],
            env,
            seconds,
            lambda: answers(socket_path),
        )
        print(f"over {seconds:g} s at 1 Hz, 8 GPUs, {PROCESSES} live GPU processes (fakenvml):")
        print(f"  gpuwatch daemon      CPU {ours[0]:5.2f} % of one core   RSS {ours[1]:5.1f} MB")
        if exporter := tool("nvitop-exporter"):
            port = 9417
            theirs = measure(
                "nvitop-exporter",
                [exporter, "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"],
                env,
                seconds,
                lambda: serves_metrics(port),
            )
            print(
                f"  nvitop-exporter      CPU {theirs[0]:5.2f} % of one core   "
                f"RSS {theirs[1]:5.1f} MB"
            )
        else:
            print(
                "  (nvitop-exporter not installed: pip install nvitop-exporter into $FAKENVML_VENV)"
            )
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def pick_with_daemon(library: Path, runs: int) -> None:
    work = Path(tempfile.mkdtemp())
    socket_path = str(work / "gpuwatch.sock")
    base = fakenvml_env(library, GPUWATCH_LEASE_DIR=str(work / "leases"))
    daemon = subprocess.Popen(
        [GPUWATCH, "daemon", "--backend", "nvml", "--socket", socket_path],
        env=base,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not answers(socket_path):
            time.sleep(0.1)
        pick = [GPUWATCH, "pick", "-n", "1", "--", "true"]
        with_daemon = median_wall_ms(
            {"python -c pass": [PYTHON, "-c", "pass"], "pick, daemon up": pick},
            {**base, "GPUWATCH_SOCKET": socket_path},
            runs,
        )
        without = median_wall_ms(
            {"pick, no daemon": pick}, {**base, "GPUWATCH_SOCKET": str(work / "none.sock")}, runs
        )
    finally:
        daemon.terminate()
        daemon.wait()
    bare = with_daemon["python -c pass"]
    print(f"gpuwatch pick -n 1 -- true, median of {runs} runs (8 GPUs, fakenvml):")
    for name, ms in {**with_daemon, **without}.items():
        print(f"  {name:<18} {ms:7.1f} ms   {ms - bare:+7.1f} ms over bare python")


def history_memory() -> None:
    capacity, gpus = 24 * 3600, 8
    tracemalloc.start()
    history = History(capacity, gpus)
    allocated, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"history, 24 h at 1 Hz, {gpus} GPUs: stated {history_bytes(capacity, gpus) / 1e6:.2f} "
        f"MB, buffers {history.nbytes / 1e6:.2f} MB, allocated (tracemalloc) "
        f"{allocated / 1e6:.2f} MB"
    )


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    library = build_fakenvml()
    history_memory()
    pick_with_daemon(library, 21)
    daemon_cost(library, seconds)
