"""`import gpuwatch` stays light, and only the NVML backend touches pynvml."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.backends.daemon_client import DaemonBackend
from gpuwatch.leases.directory import LeaseDir
from tests.helpers.daemon import running_daemon
from tests.helpers.imports import (
    EVERY_COMMAND_MAY_LOAD,
    HEAVY,
    HEAVY_FOR_COMMANDS,
    NOT_THROUGH_THE_DAEMON,
    PICK_THROUGH_THE_DAEMON_MAY_LOAD,
    STATUS_THROUGH_THE_DAEMON_MAY_LOAD,
    gpuwatch_modules,
    loaded_after,
)

PACKAGE = Path(__file__).resolve().parents[2] / "gpuwatch"


def test_import_gpuwatch_loads_no_heavy_module() -> None:
    assert loaded_after("import gpuwatch").isdisjoint(HEAVY)


def test_layers_and_import_contracts_hold() -> None:
    # GIVEN the contracts in pyproject.toml: each floor imports only the floors below it,
    # only the NVML backend imports pynvml, headless floors import no textual or click
    root = Path(__file__).resolve().parents[2]
    lint = Path(sys.executable).with_name("lint-imports")
    # WHEN import-linter checks the package, THEN every contract is kept
    done = subprocess.run([str(lint)], check=False, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:]


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


def test_pick_loads_no_heavy_library() -> None:
    # `gpuwatch pick` starts jobs: it pays for click, and for nothing heavier.
    statement = (
        "import os, tempfile\n"
        "os.environ['GPUWATCH_LEASE_DIR'] = tempfile.mkdtemp()\n"
        "from gpuwatch.cli import main\n"
        "try:\n    main(['pick', '--sim', '4'])\n"
        "except SystemExit as done:\n    assert done.code == 0, done.code\n"
    )
    assert loaded_after(statement).isdisjoint(HEAVY_FOR_COMMANDS)


def test_where_loads_no_heavy_library() -> None:
    # `gpuwatch where` is asked from scripts: it loads neither the screens nor the daemon.
    statement = (
        "from gpuwatch.cli import main\n"
        "try:\n    main(['where', '--sim', '3', '-n', '1'])\n"
        "except SystemExit as done:\n    assert done.code == 0, done.code\n"
    )
    assert loaded_after(statement).isdisjoint(HEAVY_FOR_COMMANDS)


def test_importing_gpuwatch_is_nearly_free() -> None:
    # The public API is loaded on first use, so `import gpuwatch` costs scripts nothing.
    assert "dataclasses" not in loaded_after("import gpuwatch")


def test_every_public_name_resolves_without_loading_heavy_modules() -> None:
    # GIVEN a fresh interpreter WHEN a script touches every name gpuwatch exports
    code = "import gpuwatch\nfor name in gpuwatch.__all__: getattr(gpuwatch, name)"
    # THEN each resolves (the lazy table names real objects), and still no torch or UI loads
    assert loaded_after(code).isdisjoint(HEAVY)


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


def modules_after(statement: str) -> set[str]:
    """Every module (dotted names too) a fresh interpreter holds after running `statement`."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


# What `gpuwatch pick -- COMMAND` does up to the exec, which is where its cost to a job ends.
PICK_THROUGH_THE_DAEMON = """\
import os
os.environ['GPUWATCH_SOCKET'] = {socket!r}
os.environ['GPUWATCH_LEASE_DIR'] = {leases!r}
def execvpe(file, args, env):
    raise SystemExit(0 if env['CUDA_VISIBLE_DEVICES'].count('GPU-') == 2 else 'not 2 GPUs')
os.execvpe = execvpe
from gpuwatch.cli import main
try:
    main(['pick', '-n', '2', '--', 'true'])
except SystemExit as done:
    assert done.code == 0, done.code
"""


def test_pick_with_the_daemon_up_loads_no_driver_bindings_nor_heavy_library(
    tmp_path: Path,
) -> None:
    # GIVEN a daemon serving snapshots
    with running_daemon(tmp_path, scenario="[[gpu]]\ncount = 3\n") as (_, socket_path, _):
        # WHEN pick chooses 2 GPUs through it, leases them and starts a command
        statement = PICK_THROUGH_THE_DAEMON.format(
            socket=str(socket_path), leases=str(tmp_path / "leases")
        )
        loaded = modules_after(statement)
    # THEN it loads no driver bindings and no heavy library it does not use
    unused = {*HEAVY_FOR_COMMANDS, "gpuwatch.backends.nvml"}
    assert loaded & unused == set()
    assert "gpuwatch.backends.daemon_client" in loaded  # it did go through the daemon
    # AND of gpuwatch only the modules of its budget, and none of the costly standard ones
    assert gpuwatch_modules(loaded) - PICK_THROUGH_THE_DAEMON_MAY_LOAD == set()
    assert loaded.isdisjoint(NOT_THROUGH_THE_DAEMON)


# What a one-shot `gpuwatch status` does, with the daemon up and a lease to show.
STATUS_THROUGH_THE_DAEMON = """\
import os
os.environ['GPUWATCH_SOCKET'] = {socket!r}
os.environ['GPUWATCH_LEASE_DIR'] = {leases!r}
from gpuwatch.cli import main
try:
    main(['status', {extra}])
except SystemExit as done:
    assert done.code == 0, done.code
"""


@pytest.mark.parametrize("extra", ["'--json'", "'--color=always'"], ids=["json", "table"])
def test_status_with_the_daemon_up_loads_no_driver_bindings_nor_heavy_library(
    tmp_path: Path, extra: str
) -> None:
    # GIVEN a daemon serving snapshots
    with running_daemon(tmp_path, scenario="[[gpu]]\ncount = 3\n") as (_, socket_path, _):
        # AND a job holding a lease
        gpu = DaemonBackend(str(socket_path)).sample().gpus[0]
        lease_dir = LeaseDir.for_job(tmp_path / "leases", say=print)
        held = lease_dir.claim(gpu, mem_bytes=None, command="a job")
        try:
            # WHEN status shows its GPUs and the lease, as JSON or as a table
            statement = STATUS_THROUGH_THE_DAEMON.format(
                socket=str(socket_path), leases=str(tmp_path / "leases"), extra=extra
            )
            loaded = modules_after(statement)
        finally:
            held.release()
    # THEN it loads no driver bindings and no heavy library
    unused = {*HEAVY_FOR_COMMANDS, "gpuwatch.backends.nvml"}
    assert loaded & unused == set()
    assert "gpuwatch.backends.daemon_client" in loaded  # it did go through the daemon
    # AND of gpuwatch only the modules of its budget, and none of the costly standard ones
    assert gpuwatch_modules(loaded) - STATUS_THROUGH_THE_DAEMON_MAY_LOAD == set()
    assert loaded.isdisjoint(NOT_THROUGH_THE_DAEMON)


def test_help_lists_every_command_loading_none_of_them() -> None:
    # WHEN `gpuwatch --help` lists the commands
    statement = (
        "import io, contextlib\nfrom gpuwatch.cli import main\nout = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n    try:\n        main(['--help'])\n"
        "    except SystemExit:\n        pass\n"
        "from gpuwatch.cli.group import COMMANDS\n"
        "assert all(name in out.getvalue() for name in COMMANDS), out.getvalue()"
    )
    loaded = modules_after(statement)
    # THEN every command is listed (the assertion above) and none of their modules is loaded
    assert gpuwatch_modules(loaded) - EVERY_COMMAND_MAY_LOAD == set()


def test_gpuwatch_torch_resolves_on_first_use_without_importing_torch() -> None:
    # GIVEN only `import gpuwatch`
    statement = (
        "import gpuwatch\n"
        # WHEN gpuwatch.torch is used, THEN it is the watch package, and torch is not loaded
        "assert callable(gpuwatch.torch.watch)\n"
        "assert gpuwatch.torch is __import__('gpuwatch.torch').torch\n"
    )
    assert loaded_after(statement).isdisjoint(HEAVY)
