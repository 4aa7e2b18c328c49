"""Slurm's hostlist notation (`node[01-03,07],gpu14`, `/dev/nvidia[0-3,5]`), expanded as
Slurm's own `hostlist_create` does (src/common/hostlist.c): tokens split at commas and
white space outside brackets; in a token, the last bracket must end it (`n[1-3]-ib` is no
hostlist), and earlier brackets repeat what follows them; a range's numbers keep the width
of its first (`[08-10]` is 08, 09, 10). Used for node names and for gres.conf's `File=`.

Bracket order follows Slurm's recursion, not reading order: in `a[1-2]b[3-4]c[5-6]` the
second-to-last bracket varies slowest (`a1b3c5, a1b3c6, a2b3c5, ..., a1b4c5`), which is
the order slurmd gives device files written that way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_NAMES = 1 << 20
"""More names than this from one expression are not believed (Slurm's own limit is 64 Ki
per range, and as many ranges): it keeps a hostile `n[0-4000000000]` from filling memory."""
MAX_RANGE = 64 * 1024
"""Slurm's MAX_RANGE: a range of more numbers than this is an error."""

_SEPARATORS = re.compile(r"[,\s]")
_NUMBER = re.compile(r"[0-9]+")


class HostlistError(ValueError):
    """An expression that Slurm would not take as a hostlist."""


def expand_hostlist(expression: str) -> list[str]:
    """`expression`'s names in Slurm's order; `HostlistError` where Slurm would refuse it or
    it names more than `MAX_NAMES`."""
    names: list[str] = []
    for token in _tokens(expression):
        for name in _expand_token(token):
            names.append(name)
            if len(names) > MAX_NAMES:
                raise HostlistError(f"more than {MAX_NAMES} names in {expression[:80]!r}")
    return names


def hostlist_names(expression: str) -> list[str]:
    """`expand_hostlist`, or [] where the expression is no hostlist (for a node list that
    names this node or not: one that does not parse names none)."""
    try:
        return expand_hostlist(expression)
    except HostlistError:
        return []


def in_hostlist(name: str, expression: str) -> bool:
    """Whether `expression` names `name` (as slurmd's `hostlist_find` answers for gres.conf's
    and slurm.conf's `NodeName=`); False for an expression that does not parse."""
    try:
        return any(
            candidate == name for token in _tokens(expression) for candidate in _expand_token(token)
        )
    except HostlistError:
        return False


def _tokens(expression: str) -> Iterator[str]:
    """Slurm's `_next_tok`: separators outside brackets end a token."""
    depth, start = 0, 0
    for position, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and _SEPARATORS.match(char):
            if position > start:
                yield expression[start:position]
            start = position + 1
    if len(expression) > start:
        yield expression[start:]


def _expand_token(token: str) -> Iterator[str]:
    opening = token.rfind("[")
    if opening < 0:
        yield token
        return
    closing = token.find("]", opening)
    if closing < 0:
        raise HostlistError(f"an unclosed bracket in {token[:80]!r}")
    if closing != len(token) - 1:
        raise HostlistError(f"text after the last bracket in {token[:80]!r}")
    ranges = _ranges(token[opening + 1 : closing])
    yield from _with_prefix(token[:opening], ranges)


def _with_prefix(prefix: str, ranges: list[tuple[int, int, int]]) -> Iterator[str]:
    """Slurm's `_push_range_list`: the prefix's own last bracket varies slowest."""
    opening = prefix.rfind("[")
    closing = prefix.find("]", opening) if opening >= 0 else -1
    if opening < 0 or closing < 0:
        for low, high, width in ranges:
            yield from (f"{prefix}{number:0{width}d}" for number in range(low, high + 1))
        return
    head, tail = prefix[:opening], prefix[closing + 1 :]
    outer = _ranges(prefix[opening + 1 : closing])
    if sum(high - low + 1 for low, high, _ in outer) > MAX_RANGE:
        raise HostlistError(f"more than {MAX_RANGE} names in one bracket of {prefix[:80]!r}")
    for low, high, width in outer:
        for number in range(low, high + 1):
            yield from _with_prefix(f"{head}{number:0{width}d}{tail}", ranges)


def _ranges(text: str) -> list[tuple[int, int, int]]:
    """`0-3,5` as [(0, 3, 1), (5, 5, 1)]: low, high, and the width numbers are written in."""
    ranges = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise HostlistError(f"{part[:40]!r} is no number or range")
        first, last = int(low), int(high) if dash else int(low)
        if first > last or last - first + 1 > MAX_RANGE:
            raise HostlistError(f"range {part[:40]!r} is upside down or too long")
        ranges.append((first, last, len(low)))
    return ranges
