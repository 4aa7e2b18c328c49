"""Helpers shared by the benchmarks: where fakenvml and the comparison tools are, timing, and
running gpuwatch in-process."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from gpuwatch.cli import main

REPO = Path(__file__).resolve().parents[1]
FAKENVML = Path(os.environ.get("FAKENVML_DIR", REPO.parent / "shared" / "fakenvml"))
NODE_8GPU = FAKENVML / "scenarios" / "node-8gpu.txt"
# nvitop, gpustat and nvisel, installed by `make -C ../shared/fakenvml venv VENV=...`
TOOLS_VENV = Path(os.environ.get("FAKENVML_VENV", "/tmp/fakenvml/venv"))


def build_fakenvml() -> Path:
    """Builds the simulated libnvidia-ml.so.1 into a temporary folder; returns that folder."""
    if not (FAKENVML / "Makefile").is_file():
        sys.exit(f"needs {FAKENVML} (set FAKENVML_DIR)")
    build = Path(tempfile.mkdtemp(prefix="fakenvml-"))
    subprocess.run(["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True)
    return build


def fakenvml_env(library: Path, scenario: Path = NODE_8GPU, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(library),
        "FAKENVML_SCENARIO": str(scenario),
        "COLUMNS": "120",
        "LINES": "60",
        **extra,
    }
    for name in ("GPUWATCH_SIM", "GPUWATCH_BACKEND", "FAKENVML_STATS"):
        if name not in extra:
            env.pop(name, None)
    return env


def tool(name: str) -> str | None:
    """Path of a comparison tool in the tools venv, or None when it is not installed."""
    path = TOOLS_VENV / "bin" / name
    return str(path) if path.exists() else shutil.which(name)


def median_wall_ms(
    commands: dict[str, Sequence[str]], env: dict[str, str], runs: int = 21
) -> dict[str, float]:
    """Median wall time of each command, interleaved so machine noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def total_calls(stats: Path) -> int:
    return sum(int(line.split()[1]) for line in stats.read_text().splitlines())


def start_daemon(work: Path, sim: str) -> tuple[subprocess.Popen[bytes], str]:
    """The installed `gpuwatch daemon --sim SIM` on a socket in `work`, once it listens."""
    socket_path = str(work / "gpuwatch.sock")
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))  # the console script users run
    daemon = subprocess.Popen(
        [gpuwatch, "daemon", "--sim", sim, "--socket", socket_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        if daemon.poll() is not None or time.monotonic() > deadline:
            sys.exit("the daemon did not start")
        time.sleep(0.1)
    return daemon, socket_path


def run_gpuwatch(*args: str) -> tuple[int, str, str]:
    """`gpuwatch ARGS` in this process, through the console script's `main()`: (exit code,
    stdout, stderr). Much faster than a process each, for benchmarks that run thousands."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        else:
            code = 0
    return code, out.getvalue(), err.getvalue()
