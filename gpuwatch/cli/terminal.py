"""What every command shares about the terminal: its width, a reader that went away, and
the layout of help (which click draws through `gpuwatch.cli.options.HelpFormatter`).
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterable, Sequence

from gpuwatch.cli.exit_codes import ExitCode

_DEFAULT_COLUMNS = 80
_MAX_COLUMNS = 1000  # a wider COLUMNS is a mistake; a line that long helps nobody
_HELP_MAX_WIDTH = 100  # wider help is harder to read, whatever the terminal
_HELP_MIN_WIDTH = 38
_TERM_COL_MAX = 30  # click's widest option column


def terminal_columns() -> int:
    """`$COLUMNS` if it is a sensible number, else stdout's terminal width, else 80."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and columns.isascii() and len(columns) < 5:
        return max(1, min(int(columns), _MAX_COLUMNS))
    try:
        return max(1, min(os.get_terminal_size(sys.stdout.fileno()).columns, _MAX_COLUMNS))
    except (OSError, ValueError):
        return _DEFAULT_COLUMNS


def help_width(columns: int | None = None) -> int:
    """How wide help text is drawn: the terminal less a margin, within 38 to 98 columns."""
    columns = terminal_columns() if columns is None else columns
    return max(_HELP_MIN_WIDTH, min(columns, _HELP_MAX_WIDTH) - 2)


def reader_gone() -> int:
    """The reader of stdout went away (`gpuwatch status --json --watch 1 | head -1`): not
    an error. What is still buffered goes nowhere, so that exiting does not fail on it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return ExitCode.OK


def fit_line(line: str, width: int) -> str:
    """A preformatted help line (an example) within `width`: its `# comment` goes first."""
    if len(line) <= width or "  #" not in line:
        return line
    return line[: line.index("  #")].rstrip()


def definition_list(rows: Sequence[tuple[str, str]], width: int, indent: int = 2) -> list[str]:
    """Two columns, as click draws options: a term, and its text wrapped beside it.

    A term too wide for the first column has its text start on the next line.
    The first column narrows on narrow terminals so the text keeps room.
    """
    col_max = min(_TERM_COL_MAX, max(10, width // 3))
    first_col = min(max((len(term) for term, _ in rows), default=0), col_max) + 2
    text_width = max(width - indent - first_col, 10)
    lines = []
    for term, text in rows:
        wrapped = wrap(text, text_width) if text else []
        if not wrapped:
            lines.append(" " * indent + term)
            continue
        if len(term) <= first_col - 2:
            lines.append(" " * indent + term.ljust(first_col) + wrapped[0])
        else:
            lines.append(" " * indent + term)
            lines.append(" " * (indent + first_col) + wrapped[0])
        lines.extend(" " * (indent + first_col) + line for line in wrapped[1:])
    return lines


def wrap(text: str, width: int) -> list[str]:
    """`text` as lines of at most `width`, breaking at spaces only (as click does)."""
    return textwrap.wrap(
        text, width, break_long_words=False, break_on_hyphens=False, replace_whitespace=True
    )


def paragraphs(blocks: Iterable[str], width: int, indent: int = 2) -> list[str]:
    """Help text, block by block, with an empty line between blocks.

    A block is kept as written when it starts with click's `\\b` line, or is a
    heading over indented lines (`Examples:`); an example too wide loses its
    `# comment`. Any other block is wrapped to `width`.
    """
    lines: list[str] = []
    for block in blocks:
        body = block.strip("\n").splitlines()
        kept = bool(body) and body[0].strip() == "\b"
        body = body[1:] if kept else body
        if not body:
            continue
        if lines:
            lines.append("")
        if kept or (len(body) > 1 and all(line.startswith(" ") for line in body[1:])):
            lines.extend(fit_line(" " * indent + line, width) for line in body)
        else:
            text = " ".join(line.strip() for line in body)
            lines.extend(" " * indent + line for line in wrap(text, width - indent))
    return lines
