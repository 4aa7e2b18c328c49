"""Slurm's configuration files (slurm.conf, gres.conf) read into lines of `Key=value` pairs,
as Slurm's own parser reads them (`s_p_parse_file` in src/common/parse_config.c).

- `#` starts a comment unless an odd number of backslashes precede it (`\\#` is a `#`);
  comments are cut from each physical line first.
- A line whose last non-blank character is an unescaped `\\` continues on the next: the two
  are joined without the backslash (and without a space of their own).
- A backslash escapes the character after it; `\\\\` is one backslash.
- `include FILE` (the word in any case, at the very start of a line) reads FILE in its
  place. Slurm up to 22.05 takes a relative FILE in the including file's folder, 23.02 on
  in slurm.conf's: where the two differ and both exist, which is meant is not known here.
  `%c` in FILE is the ClusterName (slurm.conf only); a `*` is no glob to Slurm. Includes
  nest at most `MAX_INCLUDE_DEPTH` deep (Slurm has no limit: a loop would never end).
- Keys are letters, digits, `_` and `.`, in any case; a value is `"quoted"` (spaces
  allowed) or runs to the next blank.

Anything Slurm would refuse raises `SlurmConfigError`, saying which file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 1 << 20
MAX_INCLUDE_DEPTH = 8
MAX_FILES = 64
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s", re.IGNORECASE)


class SlurmConfigError(ValueError):
    """A configuration file Slurm would refuse, or one that cannot be read here."""


@dataclass(frozen=True, slots=True)
class ConfigLine:
    """One logical line: its `Key=value` pairs in order, and where it was read."""

    pairs: tuple[tuple[str, str], ...]
    where: str
    """`path:line`, for messages."""

    @property
    def first_key(self) -> str:
        """The line's first key, lower-cased: what kind of line it is (`nodename`, `name`)."""
        return self.pairs[0][0].lower()

    def get(self, key: str) -> str | None:
        """The value of `key` (any case); the last where a line gives it twice, as Slurm
        takes it."""
        wanted = key.lower()
        found = None
        for name, value in self.pairs:
            if name.lower() == wanted:
                found = value
        return found


def read_config(path: Path, *, slurm_conf: Path | None = None) -> list[ConfigLine]:
    """The logical lines of the file at `path` with its includes in their places.
    `slurm_conf` is the slurm.conf of the same cluster (where 23.02 on looks for includes);
    by default `path` is slurm.conf itself or beside it."""
    reader = _Reader(slurm_conf or path)
    reader.read(path, depth=0)
    return reader.lines


def split_pairs(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """`text`'s `Key=value` pairs; `SlurmConfigError` for text that is none."""
    pairs = []
    position = 0
    while match := _PAIR.match(text, position):
        value = match.group(2) if match.group(2) is not None else match.group(3)
        pairs.append((match.group(1), value))
        position = match.end()
    if text[position:].strip():
        raise SlurmConfigError(f"{where}: Slurm cannot parse {text[position:].strip()[:60]!r}")
    return tuple(pairs)


class _Reader:
    def __init__(self, slurm_conf: Path) -> None:
        self.slurm_conf = slurm_conf
        self.lines: list[ConfigLine] = []
        self.files = 0

    def read(self, path: Path, depth: int) -> None:
        self.files += 1
        if self.files > MAX_FILES:
            raise SlurmConfigError(f"{path}: more than {MAX_FILES} files included")
        text = _text_of(path)
        for number, line in logical_lines(text):
            where = f"{path}:{number}"
            if _INCLUDE.match(line):
                self._include(line, path, where, depth)
            elif line.strip():
                self.lines.append(ConfigLine(split_pairs(line, where), where))

    def _include(self, line: str, path: Path, where: str, depth: int) -> None:
        name, *rest = line[len("include") :].split()
        if rest:
            raise SlurmConfigError(f"{where}: Slurm cannot parse {' '.join(rest)[:60]!r}")
        if depth + 1 > MAX_INCLUDE_DEPTH:
            raise SlurmConfigError(f"{where}: includes nest more than {MAX_INCLUDE_DEPTH} deep")
        if "%c" in name:
            name = name.replace("%c", self._cluster_name(where))
        if "*" in name:
            raise SlurmConfigError(f"{where}: include {name}: Slurm expands no glob")
        self.read(self._included(name, path, where), depth + 1)

    def _included(self, name: str, including: Path, where: str) -> Path:
        """The file `include NAME` reads: see the module's notes on relative paths."""
        if os.path.isabs(name):
            return Path(name)
        by_file, by_conf = including.parent / name, self.slurm_conf.parent / name
        if by_file == by_conf or not by_conf.exists():
            return by_file
        if not by_file.exists():
            return by_conf
        raise SlurmConfigError(
            f"{where}: include {name} is {by_file} to Slurm 22.05 and older, {by_conf} to "
            "23.02 and newer: which one slurmd read is not known here"
        )

    def _cluster_name(self, where: str) -> str:
        names = [value for line in self.lines if (value := line.get("ClusterName")) is not None]
        if not names:
            raise SlurmConfigError(f"{where}: include with %c, but no ClusterName before it")
        return names[-1].lower()


def _text_of(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise SlurmConfigError(f"cannot read {path}: {error.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SlurmConfigError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return data.decode(errors="replace")


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line's number, text) of each logical line: comments cut, continued
    lines joined, escapes taken out; empty lines left out."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 1
    for number, physical in enumerate(text.split("\n"), start=1):
        if not pending:
            start = number
        kept = _without_comment(physical)
        continued = _continued(kept)
        pending.append(kept if continued is None else continued)
        if continued is None:
            line = _unescaped("".join(pending))
            pending = []
            if line:
                lines.append((start, line))
    if pending and (line := _unescaped("".join(pending))):
        lines.append((start, line))
    return lines


def _without_comment(line: str) -> str:
    """Slurm's `_strip_comments`: from the first `#` after an even number of backslashes."""
    backslashes = 0
    for position, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:position]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def _continued(line: str) -> str | None:
    """Slurm's `_strip_continuation`: the line without its final backslash when an odd
    number of them end it (blanks after them allowed); `None` when it does not continue."""
    stripped = line.rstrip(" \t\r\n\v\f")
    backslashes = len(stripped) - len(stripped.rstrip("\\"))
    if backslashes % 2 == 0:
        return None
    return stripped[:-1]


def _unescaped(line: str) -> str:
    """Slurm's `_strip_escapes`: each backslash dropped, the character after it kept."""
    return re.sub(r"\\(.?)", r"\1", line, flags=re.DOTALL)
