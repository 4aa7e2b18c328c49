"""Abuse figures for a shared machine: runs each `bench/abuse_*.py` in turn and prints its figures.

    python bench/abuse.py            # all of them
    python bench/abuse.py api        # only bench/abuse_api.py

Each part is a script of its own, so that one can be run alone while working on its area.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    parts = sorted(BENCH.glob("abuse_*.py"))
    if names:
        parts = [part for part in parts if part.stem.removeprefix("abuse_") in names]
    failed = 0
    for part in parts:
        print(f"== {part.name}", flush=True)
        failed += subprocess.run([sys.executable, str(part)], check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
