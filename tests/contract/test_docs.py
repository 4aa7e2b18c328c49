"""README.md is the front door and docs/ the manual: both must say what the code does."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from types import ModuleType

import markdown
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
def generator(name: str) -> ModuleType:
    """One of the scripts under docs/ that write a page, or part of one (`gen_cli`, ...)."""
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gen_cli() -> ModuleType:
    return generator("gen_cli")


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


@cache
def anchors(page: Path) -> frozenset[str]:
    """The ids of `page`'s headings, as mkdocs makes them (python-markdown's toc)."""
    html = markdown.markdown(page.read_text(), extensions=["toc", "pymdownx.superfences"])
    return frozenset(re.findall(r'<h[1-6] id="([^"]+)"', html))


@pytest.mark.parametrize("source", [ROOT / "README.md", *pages()], ids=lambda p: p.name)
def test_relative_links_resolve_to_pages_and_their_headings(source: Path) -> None:
    text = re.sub(r"```.*?```", "", source.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        page, _, anchor = target.partition("#")
        path = (source.parent / page).resolve() if page else source
        assert path.exists(), f"{source.name} links to {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{source.name} links to {target}: no such heading"


def gen_index() -> ModuleType:
    return generator("gen_index")


def test_the_architecture_page_lists_every_module_by_its_docstring() -> None:
    # GIVEN the committed page, WHEN its module list is generated from the package now
    page = DOCS / "development" / "architecture.md"
    # THEN they agree: every module is listed, on its floor, as its docstring says
    assert page.read_text() == generator("gen_architecture").render(page.read_text()), (
        "run python docs/gen_architecture.py"
    )


@pytest.mark.parametrize("page", [DOCS / "index.md", ROOT / "README.md"], ids=lambda p: p.name)
def test_the_page_list_and_dependencies_are_what_the_nav_and_pyproject_say(page: Path) -> None:
    # GIVEN the committed page, WHEN its parts are generated now, THEN they agree
    assert page.read_text() == gen_index().rendered(page), "run python docs/gen_index.py"


def test_every_page_of_the_docs_is_in_the_nav_and_on_the_index() -> None:
    # GIVEN the pages under docs/ and the generated index
    listed = {page for _, entries in gen_index().nav() for _, page in entries}
    index = (DOCS / "index.md").read_text()
    # THEN each page is in mkdocs.yml's nav, and so linked from the index
    for page in pages():
        name = page.relative_to(DOCS).as_posix()
        if name != "index.md":
            assert name in listed, f"{name} is not in mkdocs.yml's nav"
            assert f"]({name})" in index, f"docs/index.md does not link {name}"


def test_every_runtime_dependency_is_named_with_its_purpose() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    named = [name for name, purpose in gen_index().dependencies() if purpose]
    assert len(named) == len(declared)
    for name in named:
        assert f"`{name}` (" in README and f"`{name}` (" in (DOCS / "index.md").read_text()


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


def readme_recipe() -> str:
    """The README's line that takes the best node from `gpuwatch where` to ssh."""
    (line,) = [line for line in README.splitlines() if "gpuwatch where" in line and "ssh" in line]
    return line


def run_recipe(tmp_path: Path, gpuwatch: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The README's recipe in sh, with `gpuwatch` the script `gpuwatch` and an `ssh` that notes
    its arguments, one a line, in the file it returns."""
    bin_dir, noted = tmp_path / "bin", tmp_path / "ssh-args"
    bin_dir.mkdir()
    for name, body in (("gpuwatch", gpuwatch), ("ssh", f'printf "%s\\n" "$@" > {noted}')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(
        ["sh", "-c", readme_recipe()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    return result, noted


INSTALLED = shlex.quote(str(Path(sys.executable).with_name("gpuwatch")))


def test_the_readme_recipe_takes_the_best_node_to_ssh(tmp_path: Path) -> None:
    # GIVEN a simulated fleet where some node fits the README's request
    best = subprocess.run(
        [*shlex.split(INSTALLED), "where", "-n", "2", "--min-free", "40GiB", "--sim", "6"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()[0]
    # WHEN the recipe runs against it
    result, noted = run_recipe(tmp_path, f'exec {INSTALLED} "$@" --sim 6')
    # THEN ssh is given the best node's name, alone
    assert result.returncode == 0, result.stderr
    assert noted.read_text() == f"{best}\n"


def test_the_readme_recipe_stops_when_no_node_fits(tmp_path: Path) -> None:
    # GIVEN a request no node of the simulated fleet fits (a later --min-free wins)
    result, noted = run_recipe(tmp_path, f'exec {INSTALLED} "$@" --sim 6 --min-free 1000GiB')
    # WHEN the recipe runs THEN it stops with where's exit 4 and its reason; ssh never runs
    assert result.returncode == 4, result.stderr
    assert "gpuwatch: error: no node can run" in result.stderr
    assert not noted.exists()


def test_the_readme_recipe_hands_a_name_the_shell_would_read_to_ssh_as_it_is(
    tmp_path: Path,
) -> None:
    # GIVEN a node whose name holds a glob, a separator and a command substitution, and files
    # in the working directory the glob would match
    name = "gpu-0?;$(touch${IFS}PWNED)"
    for match in ("gpu-01", "gpu-02"):
        (tmp_path / match).touch()
    line = shlex.quote(f"{name} GPUs 0,1 (79.1GiB, 79.3GiB free)")
    # WHEN the recipe runs on where's line for it
    result, noted = run_recipe(tmp_path, f"printf '%s\\n' {line}")
    # THEN ssh gets the name as it is, and nothing of it ran
    assert result.returncode == 0, result.stderr
    assert noted.read_text() == f"{name}\n"
    assert not (tmp_path / "PWNED").exists()
