"""Abuse by scenario files: 1000 random ones through status, pick and the daemon's sampling.

    python bench/abuse_scenarios.py [COUNT]

Prints how many files loaded and how many were refused (one line, exit code 2),
and the figures that must stay 0: tracebacks (a crash, or an exit code the
command never gives for a scenario) and non-JSON outputs (`status --json` or the
daemon's snapshot printing NaN, Infinity or anything else that is not strict
JSON). The files come from tests/helpers/scenario_strategies.py, derandomized, so every
run sees the same ones. Needs the test dependencies (hypothesis).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import REPO

sys.path.insert(0, str(REPO))
from hypothesis import HealthCheck, Phase, given, settings

from gpuwatch.backends.scenario import load_scenario
from gpuwatch.errors import ScenarioError
from tests.helpers.scenario_strategies import abuse, scenario_texts

_HANG_S = 30


class _Hang(BaseException):
    """Raised in a file's checks that ran past _HANG_S (a BaseException: main() must not
    report it as an error of its own)."""


def _hung(signum: int, frame: object) -> None:
    raise _Hang


def main(count: int) -> int:
    for name in ("GPUWATCH_BACKEND", "GPUWATCH_SIM", "CUDA_VISIBLE_DEVICES", "GPUWATCH_SOCKET"):
        os.environ.pop(name, None)
    figures: Counter[str] = Counter()
    examples: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        os.environ["GPUWATCH_LEASE_DIR"] = str(Path(folder) / "leases")
        path = Path(folder) / "node.toml"

        @given(scenario_texts())
        @settings(
            max_examples=count,
            database=None,
            derandomize=True,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run_one(text: bytes) -> None:
            path.write_bytes(text)
            figures["files"] += 1
            signal.alarm(_HANG_S)
            try:
                problems = [(name, problem) for name, problem in _checks(path) if problem]
            except _Hang:
                problems = [("all", f"hang: more than {_HANG_S} s")]
            finally:
                signal.alarm(0)
            for name, problem in problems:
                figures[problem.split(":")[0]] += 1
                if len(examples) < 5:
                    examples.append(f"{name}: {problem[:300]}\n  file: {text[:200]!r}")

        def _checks(path: Path) -> list[tuple[str, str | None]]:
            try:
                load_scenario(path)
                figures["loaded"] += 1
            except ScenarioError:
                figures["refused"] += 1
            except Exception as error:
                return [("load", f"traceback: {type(error).__name__}")]
            try:
                return list(abuse(path))
            except Exception as error:
                return [("daemon sampling", f"traceback: {type(error).__name__}")]

        signal.signal(signal.SIGALRM, _hung)

        started = time.monotonic()
        run_one()
        elapsed_s = time.monotonic() - started
    print(f"scenario files:       {figures['files']}")
    print(f"  loaded:             {figures['loaded']}")
    print(f"  refused (exit 2):   {figures['refused']}")
    print(f"tracebacks:           {figures['traceback']}")
    print(f"non-JSON outputs:     {figures['non-json']}")
    print(f"hangs (> {_HANG_S} s):        {figures['hang']}")
    print(f"(status, pick, the daemon's sampling on each; {elapsed_s:.0f} s)")
    for example in examples:
        print(example)
    return 1 if figures["traceback"] or figures["non-json"] or figures["hang"] else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
