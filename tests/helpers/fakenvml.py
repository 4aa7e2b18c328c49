"""The simulated driver library in ../shared/fakenvml: where it is, building it, running
gpuwatch over it, and reading its scenario files and call counts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FAKENVML = Path(
    os.environ.get("FAKENVML_DIR", Path(__file__).resolve().parents[3] / "shared" / "fakenvml")
)


SCENARIOS = FAKENVML / "scenarios"


NEEDS_FAKENVML = pytest.mark.skipif(
    not (FAKENVML / "Makefile").is_file()
    or shutil.which("make") is None
    or shutil.which("cc") is None,
    reason="needs ../shared/fakenvml and a C compiler",
)

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def gpuwatch(
    library_dir: Path, scenario: Path, *args: str, stats: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_dir), "FAKENVML_SCENARIO": str(scenario)}
    env.pop("GPUWATCH_SIM", None)
    if stats is not None:
        env["FAKENVML_STATS"] = str(stats)
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def records(scenario: Path, kind: str) -> list[dict[str, str]]:
    found = []
    for line in scenario.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == kind:
            found.append(dict(word.split("=", 1) for word in words[1:]))
    return found


def size(text: str) -> int:
    number = text.rstrip("KMGiB")
    return int(float(number) * UNITS[text[len(number) :]])


def total_calls(stats: Path) -> int:
    return sum(int(line.split()[1]) for line in stats.read_text().splitlines())
