"""What `gpuwatch tui` costs: time to a full frame, steady CPU beside nvitop, RSS over hours.

All of it over ../shared/fakenvml's simulated 8-GPU node, read through the real
pynvml bindings (`--backend nvml`), in real terminals (tmux):

1. launch to first full frame: from starting `gpuwatch tui` until all 8 GPU cards and
   the process table are on screen (median of several launches);
2. steady CPU at a 1 s refresh over 60 s, with 100 processes, beside nvitop's TUI
   (`nvitop --interval 1`) on the same node, both running at once;
3. memory over four simulated hours: 14,400 frames fed to the app (headless), one per
   simulated second (painted every 5th, to finish in minutes), while the processes churn as
   on a busy machine (every 10 s, 10 of the 100 exit and 10 new pids appear). Every 20
   minutes: RSS, the interpreter's allocated blocks (RSS also counts allocator
   fragmentation) and the fill of Textual's DataTable render caches. The first hour fills
   every bounded buffer and cache; from hour 2 to hour 4 nothing may grow per frame.

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
HOURS = 4  # the first hour fills every bounded buffer and cache; hours 2 to 4 must stay flat
CHURN_EVERY_S = 10
CHURN_COUNT = 10
FIRST_CHURN_PID = 1_000_000  # above the scenario's own pids
WORKER = "python worker.py"


def scenario_with_processes(total: int) -> Path:
    """node-8gpu.txt with small worker processes added until it has `total` processes."""
    lines = NODE_8GPU.read_text().splitlines()
    have = sum(line.startswith("proc ") for line in lines)
    for number in range(total - have):
        lines.append(
            f"proc gpu={number % 8} pid={60000 + number} used=256MiB kind=compute "
            f'name="{WORKER} --id {number}"'
        )
    path = Path(tempfile.mkdtemp(prefix="tui-bench-")) / f"node-8gpu-{total}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


class Terminal:
    """One program in a detached tmux session of SIZE, started with `exec` so the pane's
    pid is the program's."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.name = f"tui-bench-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name]  # a server of its own: no other session interferes
        exports = " ".join(
            f"{name}={shlex.quote(env[name])}"
            for name in ("LD_LIBRARY_PATH", "FAKENVML_SCENARIO", "GPUWATCH_LEASE_DIR")
            if name in env
        )
        command = f"exec env {exports} TERM=xterm-256color {shlex.join(argv)}"
        subprocess.run(
            [
                *self.tmux,
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
        return subprocess.run(
            [*self.tmux, *args], capture_output=True, text=True, check=False
        ).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS_PER_S

    def close(self) -> None:
        self._tmux("kill-server")


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


class Churn:
    """Rewrites the scenario every CHURN_EVERY_S: the CHURN_COUNT oldest worker processes
    exit and as many start under new pids (fakenvml re-reads a changed file)."""

    def __init__(self, scenario: Path) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="tui-bench-churn-")) / scenario.name
        lines = scenario.read_text().splitlines()
        self._fixed = [line for line in lines if WORKER not in line]
        self._pids = list(range(FIRST_CHURN_PID, FIRST_CHURN_PID + len(lines) - len(self._fixed)))
        self._write()

    def step(self) -> None:
        newest = self._pids[-1]
        self._pids = self._pids[CHURN_COUNT:] + list(range(newest + 1, newest + 1 + CHURN_COUNT))
        self._write()

    def _write(self) -> None:
        workers = [
            f"proc gpu={pid % 8} pid={pid} used={256 + pid % 64}MiB kind=compute "
            f'name="{WORKER} --id {pid}"'
            for pid in self._pids
        ]
        temporary = self.path.with_suffix(".new")
        temporary.write_text("\n".join([*self._fixed, *workers]) + "\n")
        os.replace(temporary, self.path)


def memory_over_hours() -> list[tuple[int, float, int, str]]:
    """Runs in the fakenvml environment: (frames fed, RSS MiB, allocated blocks, DataTable
    cache fill) every 1,200 frames."""
    import gc

    import psutil
    from msgspec.structs import replace

    from gpuwatch.backends import open_backend
    from gpuwatch.tui.node.app import GpuwatchApp
    from gpuwatch.tui.node.sources import LocalSource

    churn = Churn(Path(os.environ["FAKENVML_SCENARIO"]))
    os.environ["FAKENVML_SCENARIO"] = str(churn.path)  # read by nvmlInit, below
    start = time.time()
    clock = [start]
    source = LocalSource(open_backend("nvml"), None)
    app = GpuwatchApp([source], clock=lambda: clock[0], sample=False)
    me = psutil.Process()
    readings = []

    async def run() -> None:
        async with app.run_test(size=SIZE) as pilot:
            table = app.table()
            for second in range(HOURS * 3600 + 1):
                if second and second % CHURN_EVERY_S == 0:
                    churn.step()
                clock[0] = start + second
                frame = source.read()
                assert frame.snapshot is not None
                app.feed(0, replace(frame, snapshot=replace(frame.snapshot, taken_at=clock[0])))
                if second % 5 == 0:
                    await pilot.pause()  # let the screen catch up and paint
                if second % 1200 == 0:
                    gc.collect()
                    readings.append(
                        (
                            second,
                            me.memory_info().rss / (1 << 20),
                            sys.getallocatedblocks(),
                            _cache_fill(table),
                        )
                    )

    asyncio.run(run())
    return readings


def _cache_fill(table: object) -> str:
    """How full Textual's DataTable render caches are (LRU caches with a fixed size)."""
    names = ("_cell_render_cache", "_row_render_cache", "_line_cache")
    caches = [getattr(table, name, None) for name in names]
    return "/".join(str(len(cache)) if cache is not None else "?" for cache in caches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=7)
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["launch", "cpu", "rss"], help="run one part")
    args = parser.parse_args()
    if args.rss_child:
        for frames, mib, blocks, fill in memory_over_hours():
            print(f"{frames} {mib:.2f} {blocks} {fill}")
        return
    library = build_fakenvml()
    lease_dir = tempfile.mkdtemp(prefix="tui-bench-leases-")
    env = fakenvml_env(library, GPUWATCH_LEASE_DIR=lease_dir)

    if args.only in (None, "launch"):
        report_launch(env, args.launches)
    busy = fakenvml_env(library, scenario_with_processes(100), GPUWATCH_LEASE_DIR=lease_dir)
    if args.only in (None, "cpu"):
        report_cpu(busy, args.cpu_seconds)
    if args.only in (None, "rss"):
        report_rss(busy)


def report_launch(env: dict[str, str], count: int) -> None:
    launches = sorted(first_frame_s(env) for _ in range(count))
    print(f"launch to first full frame, 8 GPUs / 40 processes, {SIZE[0]}x{SIZE[1]} (tmux):")
    print(
        f"  median of {count}: {statistics.median(launches):.2f} s  "
        f"(min {launches[0]:.2f}, max {launches[-1]:.2f}; load average now "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )


def report_cpu(env: dict[str, str], seconds: float) -> None:
    print(f"steady CPU over {seconds:g} s, 8 GPUs / 100 processes, both at once (tmux):")
    for name, pct in steady_cpu(env, seconds).items():
        print(f"  {name:<28} {pct:5.1f} % of one core")


def report_rss(env: dict[str, str]) -> None:
    child = subprocess.run(
        [sys.executable, __file__, "--rss-child"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    readings = [line.split() for line in child.stdout.splitlines()]
    print(
        f"memory over {HOURS} simulated hours at 1 s (headless), 8 GPUs / 100 processes, "
        f"{CHURN_COUNT} new pids every {CHURN_EVERY_S} s:"
    )
    print("  frames      RSS    allocated blocks   DataTable caches (cells/rows/lines)")
    for frames, mib, blocks, fill in readings:
        print(f"  {frames:>6}  {float(mib):7.1f} MiB  {int(blocks):>10,}        {fill}")
    steady = [r for r in readings if int(r[0]) >= 3600]
    (first, low_mib, low_blocks, _), (last, high_mib, high_blocks, _) = steady[0], steady[-1]
    frames = int(last) - int(first)
    print(
        f"  growth from frame {first} to {last}: "
        f"{1024 * (float(high_mib) - float(low_mib)) / frames:.3f} KiB RSS and "
        f"{(int(high_blocks) - int(low_blocks)) / frames:.3f} blocks per frame"
    )


if __name__ == "__main__":
    main()
