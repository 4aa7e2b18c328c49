"""Text that others wrote, made safe to show: the one `printable()`.

GPU names and driver versions, scenario files, other nodes' answers, exporter
labels, Prometheus, Slurm's job names, lease files: any of them may carry what a
terminal acts on instead of showing (an escape sequence that retitles the window or
writes the clipboard, a bidi override that makes a name read backwards). Such text is
made printable once, where it enters the model (`gpuwatch.models`, the jobs' table),
so that no screen, JSON document or metric has to remember to.
"""

from __future__ import annotations

import msgspec

REPLACEMENT = "?"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on instead of show replaced by `?`.

    That is what `str.isprintable()` is false for: control characters (ESC, BEL, DEL,
    the C1 controls such as U+009B, which some terminals read as ESC `[`), format
    characters (U+202E, which flips what follows right to left; zero-width spaces),
    line and paragraph separators, surrogates (undecodable bytes) and unassigned or
    private code points. The space is kept; other spaces become `?`.

    >>> printable("GPU\\x1b]0;owned\\x07")
    'GPU?]0;owned?'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else REPLACEMENT for c in text)


def printable_fields(value: msgspec.Struct, *names: str) -> None:
    """Makes the text fields `names` of `value` printable, for a frozen record's
    `__post_init__`: where text enters the model. A field may be `None`; one that is
    neither text nor `None` raises `TypeError` (a daemon's JSON may say anything)."""
    for name in names:
        text = getattr(value, name)
        if text is None:
            continue
        if not isinstance(text, str):
            raise TypeError(f"{name}: {type(text).__name__}, not text")
        if not text.isprintable():
            msgspec.structs.force_setattr(value, name, printable(text))
