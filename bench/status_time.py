"""Wall time of `gpuwatch status --json` beside `nvitop -1` and `gpustat --json`.

All three read the same simulated 8-GPU, 40-process node through the real
pynvml bindings and ../shared/fakenvml. Run: python bench/status_time.py [RUNS]
"""

from __future__ import annotations

import sys
from pathlib import Path

from _common import build_fakenvml, fakenvml_env, median_wall_ms, tool

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))  # the console script users run


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    env = fakenvml_env(build_fakenvml())
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "gpuwatch status --json": [GPUWATCH, "status", "--json"],
    }
    for name, argv in (("nvitop -1", ["-1"]), ("gpustat --json", ["--json"])):
        path = tool(name.split()[0])
        if path:
            commands[name] = [path, *argv]
        else:
            print(f"({name.split()[0]} not found: make -C ../shared/fakenvml venv VENV=/tmp/...)")
    medians = median_wall_ms(commands, env, runs)
    print(f"median wall time over {runs} runs, 8 GPUs / 40 processes (fakenvml):")
    for name, ms in medians.items():
        print(f"  {name:<24} {ms:7.1f} ms")
    ours = medians["gpuwatch status --json"]
    for other in ("nvitop -1", "gpustat --json"):
        if other in medians:
            print(f"  gpuwatch / {other:<13} {ours / medians[other]:7.2f}x")


if __name__ == "__main__":
    main()
