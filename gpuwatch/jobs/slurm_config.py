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

Bounded, since whoever may write an included file can make it anything: only regular files
are read (a FIFO would block the reader for good, a device never end), each opened without
waiting; a file and its includes hold at most `MAX_TOTAL_BYTES` in all, `MAX_FILES` files,
`MAX_INCLUDE_DEPTH` deep. The largest published gres.conf and slurm.conf files are a few
kilobytes; past these caps the configuration is refused, saying which cap, never read in
part. Lines are yielded as they are read: memory holds the text of the files open at once,
at most `MAX_TOTAL_BYTES`, not a list of every line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from gpuwatch.errors import UnreadableFileError
from gpuwatch.paths import read_regular_file

MAX_TOTAL_BYTES = 1 << 20
"""The most bytes one configuration file and all it includes may hold (1 MiB)."""
MAX_INCLUDE_DEPTH = 8
MAX_FILES = 64
_PAIR = re.compile(r'\s*([A-Za-z0-9_.]+)\s*[-*+/]?=\s*(?:"([^"]*)"|(\S+))(?=\s|$)')
_INCLUDE = re.compile(r"include\s", re.IGNORECASE)


class SlurmConfigError(ValueError):
    """A configuration file Slurm would refuse, or one that cannot be read here."""


class UnreadableConfig(SlurmConfigError):
    """A configuration file that is there but cannot be read: permission denied, no
    regular file, or past a cap. (A missing one is a plain `SlurmConfigError`.)"""


class ConfigLine(msgspec.Struct, frozen=True):
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


def read_config(path: Path, *, slurm_conf: Path | None = None) -> Iterator[ConfigLine]:
    """The logical lines of the file at `path` with its includes in their places, as they
    are read. `slurm_conf` is the slurm.conf of the same cluster (where 23.02 on looks for
    includes); by default `path` is slurm.conf itself or beside it. `SlurmConfigError`
    raises where the reading meets what Slurm would refuse, or a cap."""
    return _Reader(slurm_conf or path).read(path, depth=0, where=None)


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
        self.cluster_name: str | None = None
        self.files = 0
        self.bytes_left = MAX_TOTAL_BYTES

    def read(self, path: Path, depth: int, where: str | None) -> Iterator[ConfigLine]:
        """`path`'s lines; `where` is the line that includes it, for messages."""
        self.files += 1
        if self.files > MAX_FILES:
            raise SlurmConfigError(f"{where}: more than {MAX_FILES} files included")
        try:
            text = self._text_of(path)
        except SlurmConfigError as error:
            if where is None:
                raise
            raise type(error)(f"{where}: {error}") from None
        for number, line in logical_lines(text):
            where = f"{path}:{number}"
            if _INCLUDE.match(line):
                yield from self._include(line, path, where, depth)
            elif line.strip():
                config_line = ConfigLine(split_pairs(line, where), where)
                if (name := config_line.get("ClusterName")) is not None:
                    self.cluster_name = name
                yield config_line

    def _include(self, line: str, path: Path, where: str, depth: int) -> Iterator[ConfigLine]:
        name, *rest = line[len("include") :].split()
        if rest:
            raise SlurmConfigError(f"{where}: Slurm cannot parse {' '.join(rest)[:60]!r}")
        if depth + 1 > MAX_INCLUDE_DEPTH:
            raise SlurmConfigError(f"{where}: includes nest more than {MAX_INCLUDE_DEPTH} deep")
        if "%c" in name:
            if self.cluster_name is None:
                raise SlurmConfigError(f"{where}: include with %c, but no ClusterName before it")
            name = name.replace("%c", self.cluster_name.lower())
        if "*" in name:
            raise SlurmConfigError(f"{where}: include {name}: Slurm expands no glob")
        return self.read(self._included(name, path, where), depth + 1, where)

    def _included(self, name: str, including: Path, where: str) -> Path:
        """The file `include NAME` reads: see the module's notes on relative paths."""
        if os.path.isabs(name):
            return Path(name)
        by_file, by_conf = including.parent / name, self.slurm_conf.parent / name
        if by_file == by_conf or not _present(by_conf):
            return by_file
        if not _present(by_file):
            return by_conf
        raise SlurmConfigError(
            f"{where}: include {name} is {by_file} to Slurm 22.05 and older, {by_conf} to "
            "23.02 and newer: which one slurmd read is not known here"
        )

    def _text_of(self, path: Path) -> str:
        """The file's text, if it is a regular file within what is left of the byte cap
        (`gpuwatch.paths.read_regular_file`: read without opening a device or waiting on a FIFO)."""
        try:
            data = read_regular_file(path, self.bytes_left)
        except UnreadableFileError as error:
            raise _refusal(path, error) from None
        self.bytes_left -= len(data)
        return data.decode(errors="replace")


def _refusal(path: Path, error: UnreadableFileError) -> SlurmConfigError:
    """Why `path` is not read: a plain `SlurmConfigError` where it is missing,
    `UnreadableConfig` else."""
    if error.max_bytes is not None:
        return UnreadableConfig(
            f"{path}: the configuration and its includes hold more than "
            f"{MAX_TOTAL_BYTES} bytes, more than any Slurm cluster's"
        )
    wrong = SlurmConfigError if error.missing else UnreadableConfig
    return wrong(f"cannot read {path}: {_why(error)}")


def _why(error: UnreadableFileError) -> str:
    """What is wrong with a file, in words: "permission denied", "it is a FIFO, not a
    regular file"."""
    return f"it is {error}" if error.kind is not None else str(error).lower()


def _present(path: Path) -> bool:
    """Whether `path` is there: True where it cannot be told for want of permission (then
    reading it says "permission denied", never "not found")."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first physical line's number, text) of each logical line: comments cut, continued
    lines joined, escapes taken out; empty lines left out."""
    pending: list[str] = []
    start = 1
    for number, physical in enumerate(_split_lines(text), start=1):
        if not pending:
            start = number
        kept = _without_comment(physical)
        continued = _continued(kept)
        pending.append(kept if continued is None else continued)
        if continued is None:
            line = _unescaped("".join(pending))
            pending = []
            if line:
                yield start, line
    if pending and (line := _unescaped("".join(pending))):
        yield start, line


def _split_lines(text: str) -> Iterator[str]:
    """`text.split("\\n")`, one line at a time (no list of them all)."""
    start = 0
    while (end := text.find("\n", start)) >= 0:
        yield text[start:end]
        start = end + 1
    yield text[start:]


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
