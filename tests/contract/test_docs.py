"""README.md is the front door and docs/ the manual: both must say what the code does."""

from __future__ import annotations

import importlib.util
import re
import shlex
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.cli.group import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CLI_PAGE = DOCS / "reference" / "cli.md"
README_LIMIT_CHARS = 8000


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


@cache
def gen_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def help_of(command: str) -> str:
    return str(gen_cli().help_text(command))


def test_ci_runs_the_readme_test_command() -> None:
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", quick_start, re.DOTALL)
    assert len(commands) == 2, "the quick start has two commands"
    test_command = commands[1].strip()
    assert "torch==2.13.0" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_stays_a_front_door() -> None:
    assert len(README) <= README_LIMIT_CHARS, f"README.md is {len(README)} characters"


@pytest.mark.parametrize("source", [ROOT / "README.md", *pages()], ids=lambda p: p.name)
def test_relative_links_resolve(source: Path) -> None:
    text = re.sub(r"```.*?```", "", source.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (source.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{source.name} links to {target}, which does not exist"


def test_every_command_has_a_docs_section() -> None:
    headings = "\n".join(
        line for page in pages() if page != CLI_PAGE for line in page.read_text().splitlines()
    )
    for name in COMMANDS:
        assert re.search(rf"^#+ .*`gpuwatch {name}`", headings, re.MULTILINE), (
            f"docs/ lacks a section for gpuwatch {name}"
        )


def test_the_cli_reference_is_what_the_commands_print() -> None:
    # GIVEN the committed page, WHEN the commands' --help is rendered now, THEN they agree
    assert CLI_PAGE.read_text() == gen_cli().render(), "run python docs/gen_cli.py"


def test_exit_code_table_matches_the_code() -> None:
    table = (DOCS / "reference" / "exit-codes.md").read_text()
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}


def shown_invocations(text: str) -> list[tuple[str, list[str]]]:
    """Every `gpuwatch COMMAND ...` of the shell examples, as (command, its options)."""
    found = []
    for block in re.findall(r"```(?:sh|console)\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            command_line = line.split(" #", 1)[0]
            pattern = r"(?:^|\$ |\$\(|&& |\| )gpuwatch ([a-z-]+)((?: [^|;&)>]*)?)"
            for match in re.finditer(pattern, command_line):
                words = shlex.split(match.group(2).split(" -- ", 1)[0])
                found.append((match.group(1), [w.split("=")[0] for w in words if w[:1] == "-"]))
    return found


EXAMPLES = [
    (source, command, option)
    for source in [ROOT / "README.md", *pages()]
    if source != CLI_PAGE
    for command, options in shown_invocations(source.read_text())
    for option in (options or [""])
]


@pytest.mark.parametrize(
    ("source", "command", "option"),
    EXAMPLES,
    ids=[f"{s.name}-{c}{o}" for s, c, o in EXAMPLES],
)
def test_examples_use_commands_and_options_that_exist(
    source: Path, command: str, option: str
) -> None:
    assert command in COMMANDS, f"{source.name} shows gpuwatch {command}, which does not exist"
    if option:
        pattern = rf"(?<![\w-]){re.escape(option)}(?![\w-])"
        assert re.search(pattern, help_of(command)), (
            f"{source.name} shows gpuwatch {command} {option}, which its --help lacks"
        )
