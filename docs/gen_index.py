"""Writes the parts of docs/index.md and README.md that other files already say, so that they
cannot go stale: the list of pages (from mkdocs.yml's nav) and the runtime dependencies (from
pyproject.toml, each with what it is for, from the comment beside it there).

Run `python docs/gen_index.py` after changing the nav or the dependencies;
`python docs/gen_index.py --check` (and tests/contract/test_docs.py) fails while a part is
stale. Each part lies between `<!-- gen_index.py: NAME -->` and `<!-- /gen_index.py -->`; the
text around it is written by hand.
"""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path

import yaml  # the nav is YAML; pyyaml is a runtime dependency already

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs" / "index.md"
README = ROOT / "README.md"
END = "<!-- /gen_index.py -->"
WIDTH = 100


def nav() -> list[tuple[str, list[tuple[str, str]]]]:
    """mkdocs.yml's nav as (section, [(title, page)]), the home page left out."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    sections = []
    for entry in config["nav"]:
        ((section, pages),) = entry.items()
        if isinstance(pages, list):
            sections.append((section, [next(iter(page.items())) for page in pages]))
    return sections


def dependencies() -> list[tuple[str, str]]:
    """The runtime dependencies as (distribution, what it is for), in pyproject's order."""
    text = (ROOT / "pyproject.toml").read_text()
    found = []
    for requirement in tomllib.loads(text)["project"]["dependencies"]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        comment = re.search(rf'^\s*"{re.escape(requirement)}",\s*#\s*(.+)$', text, re.MULTILINE)
        if comment is None:
            raise SystemExit(f"pyproject.toml: say what {name} is for, in a comment beside it")
        found.append((name, comment.group(1).strip()))
    return found


def dependency_text() -> str:
    said = ", ".join(f"`{name}` ({purpose})" for name, purpose in dependencies())
    return "\n".join(wrap(f"Runtime dependencies: {said}."))


def wrap(text: str) -> list[str]:
    """Lines of at most `WIDTH`, broken at spaces only, as the pages are written."""
    return textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def index_pages() -> str:
    return "\n\n".join(
        "\n".join(
            wrap(f"**{section}**: " + " · ".join(f"[{title}]({page})" for title, page in pages))
        )
        for section, pages in nav()
    )


def readme_pages() -> str:
    rows = [
        f"| {section} | " + " · ".join(f"[{title}](docs/{page})" for title, page in pages) + " |"
        for section, pages in nav()
    ]
    return "\n".join(["| | |", "| --- | --- |", *rows])


PARTS: dict[Path, dict[str, Callable[[], str]]] = {
    INDEX: {"pages": index_pages, "dependencies": dependency_text},
    README: {"pages": readme_pages, "dependencies": dependency_text},
}


def rendered(path: Path) -> str:
    """`path`'s text with each of its generated parts written anew."""
    text = path.read_text()
    for name, make in PARTS[path].items():
        start = f"<!-- gen_index.py: {name} -->"
        part = re.search(rf"{re.escape(start)}\n.*?{re.escape(END)}", text, re.DOTALL)
        if part is None:
            raise SystemExit(f"{path.name}: no {start} ... {END} part")
        text = f"{text[: part.start()]}{start}\n{make()}\n{END}{text[part.end() :]}"
    return text


def main() -> int:
    stale = [path for path in PARTS if path.read_text() != rendered(path)]
    if sys.argv[1:] == ["--check"]:
        for path in stale:
            print(f"{path} is stale: run python docs/gen_index.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(rendered(path))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
