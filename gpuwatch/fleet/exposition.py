"""The Prometheus text format, read for the few families the fleet maps, from bytes a node sent.

Our own parser, not `prometheus_client.parser`, because the library costs more than the
house's 20 % of the figure it touches: a direct read of a fleet (`ScrapeSource.read()`,
`gpuwatch where --node`, `fleet --once`). Measured side by side (`bench/fleet_cost.py`
(d), runs interleaved, a 2-core machine shared with other work), 100 nodes all answering
(80 gpuwatch daemons of 8 GPUs, 10 dcgm-exporters, 10 nvidia_gpu_exporters, their recorded
output): 0.72 to 1.02 s with this parser, 1.70 to 2.02 s with the library's (+98 % to
+144 %, four runs). The library builds a family object for every line and scans labels a
character at a time; this reads only the lines whose name the fleet maps, labels by one
regular expression. (Where 5 nodes hang, both read within the 2 s timeout: each node is
parsed in its thread while the others are awaited.)
What it does not understand it skips: a node's answer is input, not an error of ours.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import msgspec

_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
MAX_LABELS = 64


class Sample(msgspec.Struct, frozen=True, gc=False):
    """One series' value: a metric name, its labels, and a finite number.

    Not tracked by the cyclic garbage collector (`gc=False`): a sample holds only texts
    and a number, so it is never part of a cycle, and a read of 10,000 nodes makes
    100,000 of them, whose passes of the collector cost `gpuwatch where` a fifth of its
    CPU time (bench/fleet_scale.py)."""

    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str, prefixes: tuple[str, ...]) -> Iterator[Sample]:
    """The samples of `text` whose metric names start with one of `prefixes`; lines that do
    not parse, and values that are not finite, are skipped."""
    for line in text.splitlines():
        if line.startswith(prefixes) and (sample := _parse_line(line)) is not None:
            yield sample


def _parse_line(line: str) -> Sample | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        labels, rest = _parse_labels(line, brace + 1)
        if labels is None:
            return None
    else:
        if space == -1:
            return None
        name, labels, rest = line[:space], {}, line[space:]
    fields = rest.split()
    if not fields or not name.isidentifier():
        return None
    value = parse_value(fields[0])
    return None if value is None else Sample(name, labels, value)


def _parse_labels(line: str, start: int) -> tuple[dict[str, str] | None, str]:
    labels: dict[str, str] = {}
    position = start
    while len(labels) <= MAX_LABELS:
        if line.startswith("}", position):
            return labels, line[position + 1 :]
        match = _LABEL.match(line, position)
        if match is None:
            break
        labels[match[1]] = _UNESCAPE.sub(lambda m: _ESCAPES.get(m[1], m[0]), match[2])
        position = match.end()
        while line.startswith(" ", position):
            position += 1
    return None, ""


def parse_value(text: str) -> float | None:
    """A sample value as Prometheus writes it, or `None` when it is not a finite number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
