"""Running `gpuwatch` in-process as its console script does, and the frozen clock tests share."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from click.testing import CliRunner

from gpuwatch.cli import main

FROZEN_TIME = 1_790_000_000.0


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str, env: dict[str, str | None] | None = None) -> CliResult:
    """Runs `gpuwatch ARGS` in-process, through the same `main()` as the console script."""
    runner = CliRunner()
    with runner.isolation(env=env) as (out, err, _):
        try:
            main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        else:  # pragma: no cover - main() always exits
            code = -1
        sys.stdout.flush()
        sys.stderr.flush()
        return CliResult(code, out.getvalue().decode(), err.getvalue().decode())


def under(lines: list[str], index: int) -> list[str]:
    """The lines between GPU `index`'s line and the next GPU's."""
    start = next(n for n, line in enumerate(lines) if line.startswith(f"[{index}] "))
    rest = lines[start + 1 :]
    end = next((n for n, line in enumerate(rest) if line.startswith("[")), len(rest))
    return rest[:end]
