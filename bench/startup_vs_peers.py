"""gpuwatch's one-shot commands beside their peers, as whole processes, on 8 simulated GPUs.

- `gpuwatch status --json` beside `nvitop -1`;
- `gpuwatch pick -n 1 -- true` beside `nvisel -n 1`.

All read the simulated 8-GPU, 40-process node of ../shared/fakenvml through the real
bindings. Each pair runs in turn (A B A B ...) after one warm-up run of each, so that a
machine slowing down slows both; each run's ratio is taken against its partner's, and the
median, min and max of the ratios are printed, for wall time and for CPU time (the
children's user + system time, steadier than wall time on a shared machine). Bytecode is
written and read (PYTHONDONTWRITEBYTECODE is dropped), as for an installed package.

Where valgrind is installed, each command's instructions are counted too (callgrind, one run
each after the warm-up): the same count whatever the load, so the figure to compare with
the issue's bound (0.75x the peer). A command that hands over with exec (pick) is counted
up to its exec. Time an installed gpuwatch (`pip install .`), not an editable one: the
editable finder adds about 50 M instructions to every start.

Run: FAKENVML_VENV=../shared/fakenvml/.venv python bench/startup_vs_peers.py [RUNS]
(the peers from `make -C ../shared/fakenvml venv VENV=...`; default RUNS 21)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import build_fakenvml, fakenvml_env, tool
from pick_startup import GPUWATCH, timed

PAIRS = {
    "status --json / nvitop -1": ([GPUWATCH, "status", "--json"], ("nvitop", "-1")),
    "pick -n 1 -- true / nvisel -n 1": (
        [GPUWATCH, "pick", "-n", "1", "--", "true"],
        ("nvisel", "-n", "1"),
    ),
}


def spread(values: list[float], unit: str = "") -> str:
    """`median (min to max)` of `values`."""
    return f"{statistics.median(values):.3f}{unit} ({min(values):.3f} to {max(values):.3f})"


def compare(ours: list[str], theirs: list[str], env: dict[str, str], runs: int) -> None:
    """Times `ours` and `theirs` in turn `runs` times; prints each and their ratios."""
    timed(ours, env)  # warm-up: bytecode written, files in the page cache
    timed(theirs, env)
    walls: dict[str, list[float]] = {"A": [], "B": []}
    cpus: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(runs):
        for side, argv in (("A", ours), ("B", theirs)):
            wall_ms, cpu_ms = timed(argv, env)
            walls[side].append(wall_ms)
            cpus[side].append(cpu_ms)
    for side in "AB":
        print(f"    {side} wall {spread(walls[side], ' ms')}   CPU {spread(cpus[side], ' ms')}")
    wall_ratios = [a / b for a, b in zip(walls["A"], walls["B"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpus["A"], cpus["B"], strict=True)]
    print(f"    A/B wall {spread(wall_ratios, 'x')}   CPU {spread(cpu_ratios, 'x')}")


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """Instructions `argv` executes, as callgrind counts them (up to an exec, where it execs)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        callgrind = ["valgrind", "--tool=callgrind", "--dump-before=execve"]
        subprocess.run(
            [*callgrind, f"--callgrind-out-file={out}", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        # one file per dump: before each execve (pick's exec of its command), and at exit
        return sum(
            int(line.split()[1])
            for dump in Path(folder).glob("callgrind.out*")
            for line in dump.read_text().splitlines()
            if line.startswith("summary:")
        )


def count(ours: list[str], theirs: list[str], env: dict[str, str]) -> None:
    """Prints the instructions of `ours` and `theirs`, and their ratio."""
    ours_count, theirs_count = instructions(ours, env), instructions(theirs, env)
    print(
        f"    instructions  A {ours_count / 1e6:.0f} M   B {theirs_count / 1e6:.0f} M"
        f"   A/B {ours_count / theirs_count:.2f}x"
    )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    env = fakenvml_env(build_fakenvml(), GPUWATCH_LEASE_DIR=tempfile.mkdtemp())
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"{runs} runs of each, in turn; median (min to max)")
    for name, (ours, (peer, *peer_args)) in PAIRS.items():
        path = tool(peer)
        if path is None:
            print(f"  {name}: {peer} not found (set FAKENVML_VENV)")
            continue
        print(f"  {name}   A: {' '.join(ours[1:])}   B: {Path(path).name} {' '.join(peer_args)}")
        compare(ours, [path, *peer_args], env, runs)
        if shutil.which("valgrind") is not None:
            count(ours, [path, *peer_args], env)


if __name__ == "__main__":
    main()
