"""What `gpuwatch tui` costs: time to a full frame, steady CPU beside nvitop, RSS over an hour.

All of it over ../shared/fakenvml's simulated 8-GPU node, read through the real
pynvml bindings (`--backend nvml`), in real terminals (tmux):

1. launch to first full frame: from starting `gpuwatch tui` until all 8 GPU cards and
   the process table are on screen (median of several launches);
2. steady CPU at a 1 s refresh over 60 s, with 100 processes, beside nvitop's TUI
   (`nvitop --interval 1`) on the same node, both running at once;
3. RSS over one simulated hour: 3,600 frames fed to the app (headless), one per
   simulated second, RSS read every 10 minutes.

Run: python bench/tui_cost.py [--launches N] [--cpu-seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import NODE_8GPU, build_fakenvml, fakenvml_env, tool

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SIZE = (160, 48)


def scenario_with_processes(total: int) -> Path:
    """node-8gpu.txt with small worker processes added until it has `total` processes."""
    lines = NODE_8GPU.read_text().splitlines()
    have = sum(line.startswith("proc ") for line in lines)
    for number in range(total - have):
        lines.append(
            f"proc gpu={number % 8} pid={60000 + number} used=256MiB kind=compute "
            f'name="python worker.py --id {number}"'
        )
    path = Path(tempfile.mkdtemp(prefix="tui-bench-")) / f"node-8gpu-{total}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


class Terminal:
    """One program in a detached tmux session of SIZE, started with `exec` so the pane's
    pid is the program's."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.name = f"tui-bench-{uuid.uuid4().hex[:8]}"
        exports = " ".join(
            f"{name}={shlex.quote(env[name])}"
            for name in ("LD_LIBRARY_PATH", "FAKENVML_SCENARIO", "GPUWATCH_LEASE_DIR")
            if name in env
        )
        command = f"exec env {exports} TERM=xterm-256color {shlex.join(argv)}"
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(SIZE[0]),
                "-y",
                str(SIZE[1]),
                command,
            ],
            check=True,
        )
        self.pid = int(self._tmux("display-message", "-p", "-t", self.name, "#{pane_pid}"))

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], capture_output=True, text=True, check=False).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS_PER_S

    def close(self) -> None:
        self._tmux("kill-session", "-t", self.name)


def first_frame_s(env: dict[str, str]) -> float:
    start = time.perf_counter()
    terminal = Terminal([GPUWATCH, "tui", "--backend", "nvml"], env)
    try:
        while True:
            screen = terminal.text()
            if "[7] NVIDIA" in screen and " compute " in screen:  # cards and table rows
                return time.perf_counter() - start
            if time.perf_counter() - start > 30:
                raise SystemExit(f"no full frame in 30 s:\n{screen}")
            time.sleep(0.01)
    finally:
        terminal.close()


def steady_cpu(env: dict[str, str], seconds: float) -> dict[str, float]:
    programs = {
        "gpuwatch tui --interval 1": [GPUWATCH, "tui", "--backend", "nvml", "--interval", "1"]
    }
    nvitop = tool("nvitop")
    if nvitop:
        programs["nvitop --interval 1"] = [nvitop, "--interval", "1"]
    else:
        print("(nvitop not found: make -C ../shared/fakenvml venv VENV=/tmp/fakenvml/venv)")
    terminals = {name: Terminal(argv, env) for name, argv in programs.items()}
    try:
        time.sleep(10)  # start-up is measured apart; this is the steady state
        before = {name: t.cpu_s() for name, t in terminals.items()}
        time.sleep(seconds)
        return {name: 100 * (t.cpu_s() - before[name]) / seconds for name, t in terminals.items()}
    finally:
        for terminal in terminals.values():
            terminal.close()


def rss_over_an_hour() -> list[tuple[int, float]]:
    """Runs in the fakenvml environment: (frames fed, RSS MiB) every 600 frames."""
    from dataclasses import replace

    import psutil

    from gpuwatch.backends import open_backend
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.frames import LocalSource

    start = time.time()
    clock = [start]
    source = LocalSource(open_backend("nvml"), None)
    app = GpuwatchApp([source], clock=lambda: clock[0], sample=False)
    me = psutil.Process()
    readings = []

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            for second in range(3601):
                clock[0] = start + second
                frame = source.read()
                assert frame.snapshot is not None
                app.feed(0, replace(frame, snapshot=replace(frame.snapshot, taken_at=clock[0])))
                await pilot.pause()
                if second % 600 == 0:
                    readings.append((second, me.memory_info().rss / (1 << 20)))

    asyncio.run(run())
    return readings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=7)
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        for frames, mib in rss_over_an_hour():
            print(f"{frames} {mib:.2f}")
        return
    library = build_fakenvml()
    lease_dir = tempfile.mkdtemp(prefix="tui-bench-leases-")
    env = fakenvml_env(library, GPUWATCH_LEASE_DIR=lease_dir)

    launches = sorted(first_frame_s(env) for _ in range(args.launches))
    print(
        f"launch to first full frame, 8 GPUs / 40 processes, {SIZE[0]}x{SIZE[1]} (tmux), "
        f"{args.launches} launches:"
    )
    print(
        f"  median {statistics.median(launches):.2f} s  "
        f"(min {launches[0]:.2f}, max {launches[-1]:.2f})"
    )

    busy = fakenvml_env(library, scenario_with_processes(100), GPUWATCH_LEASE_DIR=lease_dir)
    print(f"steady CPU over {args.cpu_seconds:g} s, 8 GPUs / 100 processes, both at once (tmux):")
    for name, pct in steady_cpu(busy, args.cpu_seconds).items():
        print(f"  {name:<28} {pct:5.1f} % of one core")

    child = subprocess.run(
        [sys.executable, __file__, "--rss-child"],
        env=busy,
        capture_output=True,
        text=True,
        check=True,
    )
    readings = [(int(a), float(b)) for a, b in (line.split() for line in child.stdout.splitlines())]
    print("RSS over one simulated hour at 1 s (3,600 frames, headless), 8 GPUs / 100 processes:")
    for frames, mib in readings:
        print(f"  after {frames:>4} frames  {mib:7.1f} MiB")
    (first, low), (last, high) = readings[1], readings[-1]
    print(
        f"  growth from frame {first} to {last}: "
        f"{1024 * (high - low) / (last - first):.2f} KiB per frame"
    )


if __name__ == "__main__":
    main()
