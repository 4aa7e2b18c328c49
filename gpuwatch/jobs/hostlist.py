"""Slurm's hostlist notation (`node[01-03,07],gpu14`, `/dev/nvidia[0-3,5]`), expanded as
Slurm's own `hostlist_create` does (src/common/hostlist.c): tokens split at commas and
white space outside brackets; in a token, the last bracket must end it (`n[1-3]-ib` is no
hostlist), and earlier brackets repeat what follows them; a range's numbers keep the width
of its first (`[08-10]` is 08, 09, 10). Used for node names and for gres.conf's `File=`.

Bracket order follows Slurm's recursion, not reading order: in `a[1-2]b[3-4]c[5-6]` the
second-to-last bracket varies slowest (`a1b3c5, a1b3c6, a2b3c5, ..., a1b4c5`), which is
the order slurmd gives device files written that way.

An expression is bounded before anything is expanded: its names are counted first (a
product of the brackets' sizes), so `a[0-65535]b[0-65535]` is refused at once, never
listed; and `in_hostlist` matches a name against the brackets without listing any.
Nothing here recurses.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import msgspec

MAX_NAMES = 64 * 1024
"""The most names one expression may name (Slurm's own MAX_RANGE for one range); more is
`HostlistTooLarge`: it keeps a hostile `n[0-4000000000]` or `a[0-65535]b[0-65535]` from
filling memory or time."""
MAX_CHARS = MAX_NAMES * 256
"""The most characters the names of one expression may hold in all (64 Ki names of 256)."""
MAX_BRACKETS = 16
"""The most brackets in one name (real names have one to three: `r3i[4-5]n[0-1]`)."""
MAX_DIGITS = 18
"""The longest number in a bracket (Slurm reads them as 64-bit numbers)."""

_SEPARATORS = re.compile(r"[,\s]")
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_NUMBER = re.compile(r"[0-9]+")
_DIGIT_RUN = re.compile(r"[0-9]*")


class HostlistError(ValueError):
    """An expression that Slurm would not take as a hostlist: it names no node."""


class HostlistTooLarge(HostlistError):
    """An expression beyond what is believed here (`MAX_NAMES`, `MAX_CHARS`,
    `MAX_BRACKETS`, `MAX_DIGITS`), which Slurm may take: what it names is not known."""


class _Bracket(msgspec.Struct, frozen=True):
    """One bracket: its ranges (low, high, width), and the text after it up to the next."""

    ranges: tuple[tuple[int, int, int], ...]
    after: str

    @property
    def count(self) -> int:
        return sum(high - low + 1 for low, high, _ in self.ranges)

    @property
    def longest(self) -> int:
        """The longest number it writes, in characters."""
        return max(max(width, len(str(high))) for _, high, width in self.ranges)

    def values(self) -> Iterator[str]:
        for low, high, width in self.ranges:
            yield from (f"{number:0{width}d}" for number in range(low, high + 1))

    def holds(self, digits: str) -> bool:
        """Whether it writes `digits` (`08` with width 2, not `8`)."""
        number = int(digits)
        return any(
            low <= number <= high and digits == f"{number:0{width}d}"
            for low, high, width in self.ranges
        )


class _Token(msgspec.Struct, frozen=True):
    """One name or bracketed pattern: `head`, then each bracket followed by its text."""

    head: str
    brackets: tuple[_Bracket, ...]

    def count(self) -> int:
        """How many names it writes; past `MAX_NAMES` it stops counting (enough to refuse)."""
        total = 1
        for bracket in self.brackets:
            total *= bracket.count
            if total > MAX_NAMES:
                return total
        return total

    def chars(self) -> int:
        """Its longest name's length."""
        return len(self.head) + sum(len(b.after) + b.longest for b in self.brackets)

    def names(self) -> Iterator[str]:
        """Slurm's order: the second-to-last bracket slowest, then the ones before it
        backwards, the last bracket fastest."""
        if not self.brackets:
            yield self.head
            return
        last = len(self.brackets) - 1
        order = [*range(last - 1, -1, -1), last]
        values = [list(self.brackets[i].values()) for i in order]
        for combination in itertools.product(*values):
            numbers = dict(zip(order, combination, strict=True))
            yield self.head + "".join(
                numbers[i] + bracket.after for i, bracket in enumerate(self.brackets)
            )

    def matches(self, name: str) -> bool:
        """Whether it writes `name`: the places each bracket's number could end, bracket by
        bracket (a few places at most: a number is a run of digits)."""
        if not name.startswith(self.head):
            return False
        places = {len(self.head)}
        for bracket in self.brackets:
            places = {
                end + len(bracket.after)
                for place in places
                for end in _number_ends(name, place)
                if bracket.holds(name[place:end]) and name.startswith(bracket.after, end)
            }
        return len(name) in places


def expand_hostlist(expression: str) -> list[str]:
    """`expression`'s names in Slurm's order. `HostlistError` where Slurm would refuse it;
    `HostlistTooLarge` where it names more than `MAX_NAMES` (counted before any is listed)
    or is otherwise beyond the limits above."""
    tokens = _parsed(expression)
    return [name for token in tokens for name in token.names()]


def hostlist_names(expression: str) -> list[str]:
    """`expand_hostlist`, or [] where Slurm would refuse the expression (for a node list
    that names this node or not: one that does not parse names none). `HostlistTooLarge`
    still raises: what such a list names is not known."""
    try:
        return expand_hostlist(expression)
    except HostlistTooLarge:
        raise
    except HostlistError:
        return []


def in_hostlist(name: str, expression: str) -> bool:
    """Whether `expression` names `name` (as slurmd's `hostlist_find` answers for gres.conf's
    and slurm.conf's `NodeName=`), without listing its names; False for an expression Slurm
    would refuse, `HostlistTooLarge` for one beyond the limits."""
    try:
        tokens = _parsed(expression)
    except HostlistTooLarge:
        raise
    except HostlistError:
        return False
    return any(token.matches(name) for token in tokens)


def _parsed(expression: str) -> list[_Token]:
    """The expression's tokens, counted and measured against the limits."""
    tokens = [_token(text) for text in _tokens(expression)]
    names = chars = 0
    for token in tokens:
        count = token.count()
        names += count
        chars += count * token.chars()
        if names > MAX_NAMES:
            raise HostlistTooLarge(f"{_shown(expression)} names more than {MAX_NAMES} names")
        if chars > MAX_CHARS:
            raise HostlistTooLarge(f"{_shown(expression)} names more than {MAX_CHARS} characters")
    return tokens


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


def _token(text: str) -> _Token:
    parts = _BRACKET.split(text)  # head, (ranges, text after) for each bracket
    literals = parts[0::2]
    if any("[" in literal or "]" in literal for literal in literals):
        raise HostlistError(f"a bracket unclosed or nested in {_shown(text)}")
    if len(parts) > 1 and parts[-1]:
        raise HostlistError(f"text after the last bracket in {_shown(text)}")
    if len(parts) // 2 > MAX_BRACKETS:
        raise HostlistTooLarge(f"more than {MAX_BRACKETS} brackets in one name: {_shown(text)}")
    brackets = tuple(_Bracket(_ranges(parts[i]), parts[i + 1]) for i in range(1, len(parts) - 1, 2))
    return _Token(parts[0], brackets)


def _ranges(text: str) -> tuple[tuple[int, int, int], ...]:
    """`0-3,5` as ((0, 3, 1), (5, 5, 1)): low, high, and the width numbers are written in."""
    ranges = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise HostlistError(f"{_shown(part, 40)} is no number or range")
        if max(len(low), len(high)) > MAX_DIGITS:
            raise HostlistTooLarge(f"a number of more than {MAX_DIGITS} digits: {_shown(part)}")
        first, last = int(low), int(high) if dash else int(low)
        if first > last:
            raise HostlistError(f"range {_shown(part, 40)} is upside down")
        ranges.append((first, last, len(low)))
    return tuple(ranges)


def _number_ends(name: str, place: int) -> range:
    """Where a number starting at `place` in `name` may end: within its run of digits."""
    run = _DIGIT_RUN.match(name, place)
    end = min(run.end() if run else place, place + MAX_DIGITS)
    return range(place + 1, end + 1)


def _shown(text: str, limit: int = 80) -> str:
    """`text` for a message: cut, quoted, escapes visible."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
