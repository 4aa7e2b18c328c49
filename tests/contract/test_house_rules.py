"""The house rules a reader relies on, read from the source: a module imports what it uses
at its top (only a heavy library waits for the function that needs it, saying why), and
no test module imports another."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

HEAVY_LIBRARIES = {"textual", "torch", "pynvml", "prometheus_client", "yaml", "bcrypt", "grpc"}
"""What a command may not need, imported where it is used (protobuf comes with grpc)."""
HEAVY_GATEWAYS = ("gpuwatch.torch", "gpuwatch.tui.", "gpuwatch.backends.nvml")
"""gpuwatch's own modules that import a heavy library at their top (torch, textual, pynvml)."""


def imports_in_functions(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of each import made inside a function of `path`."""
    tree = ast.parse(path.read_text(), str(path))
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                yield from ((node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                yield node.lineno, "." * node.level + (node.module or "")


def heavy(module: str) -> bool:
    top = module.split(".", maxsplit=1)[0]
    return (
        top in HEAVY_LIBRARIES
        or module.startswith("google.protobuf")
        or module == "gpuwatch.torch"
        or module.startswith(HEAVY_GATEWAYS)
    )


def test_a_function_imports_only_a_heavy_library_and_says_why() -> None:
    # GIVEN every module of the package
    wrong = []
    for path in sorted((REPO / "gpuwatch").rglob("*.py")):
        lines = path.read_text().splitlines()
        # WHEN an import is made inside a function
        for line, module in imports_in_functions(path):
            said = any("#" in text for text in lines[max(0, line - 3) : line])
            # THEN it is of a heavy library (or the module that brings one), with a comment
            if not heavy(module) or not said:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module}")
    assert not wrong, "imports inside functions, not of a heavy library or not explained:\n" + (
        "\n".join(wrong)
    )


def test_no_test_module_imports_another() -> None:
    # GIVEN every module under tests/
    wrong = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            # WHEN it imports something
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            # THEN none of it is a test module: shared code lives in tests/helpers or a conftest
            if any(name.split(".")[-1].startswith("test_") for name in names):
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not wrong, "test modules imported by another:\n" + "\n".join(wrong)
