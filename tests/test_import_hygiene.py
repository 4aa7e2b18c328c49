"""`import gpuwatch` stays light, and only the NVML backend touches pynvml."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gpuwatch"
HEAVY = ("torch", "textual", "click", "pynvml")


def loaded_after(statement: str) -> set[str]:
    """Top-level modules a fresh interpreter holds after running `statement`."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


def test_import_gpuwatch_loads_no_heavy_module() -> None:
    assert loaded_after("import gpuwatch").isdisjoint(HEAVY)


@pytest.mark.parametrize(
    "module",
    [
        "gpuwatch.models",
        "gpuwatch.sampling",
        "gpuwatch.backends.sim",
        "gpuwatch.units",
        "gpuwatch.backends.scenario",
        "gpuwatch.training",
        "gpuwatch.oomreport",
        "gpuwatch.memsnapshot",
        "gpuwatch.daemon.training",
        "gpuwatch.torch",
    ],
)
def test_headless_modules_load_no_ui_torch_or_driver(module: str) -> None:
    assert loaded_after(f"import {module}").isdisjoint(HEAVY)


def test_sampling_the_simulator_loads_no_driver_bindings() -> None:
    statement = "import gpuwatch\nwith gpuwatch.open_backend(sim='2') as b: b.sample()"
    assert loaded_after(statement).isdisjoint(HEAVY)


def test_only_the_nvml_backend_imports_pynvml() -> None:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == "pynvml" for name in names):
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"backends/nvml.py"}


def test_pick_runs_without_click() -> None:
    # `gpuwatch pick` starts jobs: it must not pay for click (or anything heavier).
    statement = (
        "import os, tempfile\n"
        "os.environ['GPUWATCH_LEASE_DIR'] = tempfile.mkdtemp()\n"
        "from gpuwatch.cli import run_reporting_errors\n"
        "from gpuwatch.cli.pick import run_pick\n"
        "assert run_reporting_errors(lambda: run_pick(['--sim', '2'])) == 0"
    )
    assert loaded_after(statement).isdisjoint(HEAVY)


def test_importing_gpuwatch_is_nearly_free() -> None:
    # The public API is loaded on first use, so `import gpuwatch` costs scripts nothing.
    assert "dataclasses" not in loaded_after("import gpuwatch")


def test_without_the_driver_library_pynvml_is_never_imported(tmp_path: Path) -> None:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has the NVIDIA library")
    except OSError:
        pass
    statement = (
        "import gpuwatch\n"
        "try:\n    gpuwatch.open_backend('nvml')\n"
        "except gpuwatch.DriverNotFoundError:\n    pass"
    )
    assert "pynvml" not in loaded_after(statement)
