"""`gpuwatch status` as a table: one line per GPU, one per process and lease under it.

A MIG-enabled GPU has one line per MIG device under it, with that device's
processes and leases under the device.

Pure text in, text out: colour is decided by the caller and passed in.

Its classes are plain classes with `__slots__`, not frozen dataclasses: making
those costs every `gpuwatch status` more than drawing the table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gpuwatch.jobs.job_table import NodeJobs
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessUsage, Snapshot
from gpuwatch.sampling.node_jobs import idle_text, time_left_text
from gpuwatch.units import format_size

_GIB = float(1 << 30)
_BAR_WIDTH = 20
_MIN_NAME = 6
_MISSING = "-"


class Style:
    """How to draw: colour on or off, and whether the terminal takes block characters."""

    __slots__ = ("color", "unicode")

    def __init__(self, *, color: bool = False, unicode: bool = True) -> None:
        self.color = color
        self.unicode = unicode

    def paint(self, text: str, *codes: str) -> str:
        if not self.color or not codes:
            return text
        return f"\x1b[{';'.join(codes)}m{text}\x1b[0m"


_PLAIN = Style()
BOLD, DIM, RED, GREEN, YELLOW, CYAN = "1", "2", "31", "32", "33", "36"


def render(
    snapshot: Snapshot,
    *,
    leases: Sequence[Lease] = (),
    style: Style = _PLAIN,
    width: int = 120,
    jobs: NodeJobs | None = None,
    now: float | None = None,
    column_names: bool = False,
) -> str:
    """The whole table, ending in a newline; no line is wider than `width` (at 40 or more).

    With `jobs`, each GPU a job holds has a line saying which (its time left counted at
    `now`), each GPU whose holders a record of the scheduler's answer put in doubt a line
    saying why, and jobs that are unknown one line saying why. With `column_names`, a line
    above the GPUs names their columns."""
    lines = [_header(snapshot, style, width)]
    if jobs is not None and jobs.unknown_why is not None:
        unknown = _cut(f"jobs unknown: {jobs.unknown_why}", width, style)
        lines.append(style.paint(unknown, YELLOW))
    layout = _layout(snapshot.gpus, width, style, COLUMN_NAMES if column_names else ())
    if column_names and snapshot.gpus:
        lines.append(style.paint(_column_names(layout), DIM))
    doubted = jobs.table.holders(snapshot) if jobs is not None and jobs.table else None
    for gpu in snapshot.gpus:
        lines.append(_gpu_line(gpu, layout, style))
        if jobs is not None:
            lines.extend(
                _job_line(gpu, jobs, style, width, snapshot.taken_at if now is None else now)
            )
        if doubted is not None and (why := doubted.unknown_of(gpu)) is not None:
            lines.append(style.paint(_cut(f"  holders unknown: {why}", width, style), YELLOW))
        migs = snapshot.mig_devices_of(gpu.index)
        placed = {mig.uuid for mig in migs}
        outside = [p for p in snapshot.processes_on(gpu.index) if p.mig_uuid not in placed]
        lines.extend(_processes_and_leases(outside, gpu.uuid, leases, style, width))
        for mig in migs:
            lines.append(_mig_line(mig, layout, style, width))
            in_mig = snapshot.processes_in(mig)
            lines.extend(_processes_and_leases(in_mig, mig.uuid, leases, style, width, "  "))
    if not snapshot.gpus:
        lines.append("no GPUs")
    return "\n".join(lines) + "\n"


def _processes_and_leases(
    processes: Sequence[ProcessUsage],
    uuid: str | None,
    leases: Sequence[Lease],
    style: Style,
    width: int,
    indent: str = "",
) -> list[str]:
    ordered = sorted(processes, key=lambda p: -(p.memory_used_bytes or 0))
    lines = [_process_line(process, style, width - len(indent)) for process in ordered]
    lines.extend(
        _lease_line(lease, style, width - len(indent)) for lease in leases if lease.gpu_uuid == uuid
    )
    return [indent + line for line in lines]


def _mig_line(mig: MigDevice, layout: _Layout, style: Style, width: int) -> str:
    """`  0:2  1g.10gb   0.0 /   9.8 GiB  GI 13 CI 0`; the instance ids go first when narrow."""
    label = style.paint(f"{mig.label:>5}", BOLD)
    profile = mig.profile or mig.name or _MISSING
    head = f"  {label}  {profile:<10} | "
    head_width = 2 + max(5, len(mig.label)) + 2 + max(10, len(profile)) + 3
    if mig.error is not None:
        error = _cut("error: " + mig.error, max(10, width - head_width), style)
        return head + style.paint(error, RED)
    memory = _memory(mig, layout.bar, style)
    ids = f"GI {_or_missing(mig.gpu_instance_id)} CI {_or_missing(mig.compute_instance_id)}"
    if head_width + len(memory.plain) + 3 + len(ids) > width:
        return head + memory.painted
    return f"{head}{memory.painted} | {ids}"


def _or_missing(value: int | None) -> str:
    return _MISSING if value is None else str(value)


def _header(snapshot: Snapshot, style: Style, width: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.taken_at))
    parts = [snapshot.hostname, when]
    if snapshot.driver_version:
        parts.append(f"driver {snapshot.driver_version}")
    if snapshot.cuda_driver_version:
        parts.append(f"CUDA {snapshot.cuda_driver_version}")
    mark = " (simulated)" if snapshot.simulated else ""  # never left out: GPUs made up
    while len(parts) > 1 and len("  ".join(parts)) + len(mark) > width:  # versions go first
        parts.pop()
    host = _cut(parts[0], max(1, width - len(mark)), style)
    head = style.paint(host, BOLD) + (style.paint(mark, YELLOW) if mark else "")
    return "  ".join([head, *parts[1:]])


class _Cell:
    """Text in a table cell: what it shows (`plain`, to measure) and how (`painted`)."""

    __slots__ = ("painted", "plain")

    def __init__(self, plain: str, painted: str) -> None:
        self.plain = plain
        self.painted = painted

    @classmethod
    def of(cls, text: str, style: Style, *codes: str) -> _Cell:
        return cls(text, style.paint(text, *codes))

    def padded(self, width: int) -> str:
        return " " * (width - len(self.plain)) + self.painted


class _Layout:
    """What a GPU line shows, chosen once per table so that the columns line up.

    Narrower terminals lose, in turn: the memory bar, power, temperature, and
    then the end of the GPU's name. `cell_widths` are the widths of the metric
    columns shown, left to right.
    """

    __slots__ = ("bar", "cell_widths", "index_width", "name_width")

    def __init__(
        self, index_width: int, name_width: int, cell_widths: tuple[int, ...], bar: bool
    ) -> None:
        self.index_width = index_width
        self.name_width = name_width
        self.cell_widths = cell_widths
        self.bar = bar


COLUMN_NAMES = ("GPU", "name", "memory used / total", "util", "temp", "power / limit")
"""What the columns of a GPU's line show, as the line above them names them: each name is
cut to its column, never widens it past what the GPUs' own figures take."""
_NAMES_LEFT = {"memory used / total", "power / limit"}
"""Names of columns whose figures are pairs, read from the left."""


def _layout(
    gpus: Sequence[GpuSample], width: int, style: Style, names: Sequence[str] = ()
) -> _Layout:
    index_width = max((len(f"[{gpu.index}]") for gpu in gpus), default=3)
    name_width = max((len(gpu.name or _MISSING) for gpu in gpus), default=4)
    rows = [_cells(gpu, style, bar=False) for gpu in gpus if _readable(gpu)]
    widths = tuple(max((len(row[i].plain) for row in rows), default=4) for i in range(4))
    if names:  # a short word at least, so that a column of dashes is still named
        widths = tuple(max(w, len(n.split()[0])) for w, n in zip(widths, names[2:], strict=True))
    fixed = index_width + 1 + name_width
    for bar, kept in ((True, 4), (False, 4), (False, 3), (False, 2)):
        shown = widths[:kept]
        if fixed + sum(3 + w for w in shown) + (_BAR_WIDTH + 1 if bar else 0) <= width:
            return _Layout(index_width, name_width, shown, bar)
    rest = index_width + 1 + sum(3 + w for w in widths[:2])
    return _Layout(index_width, max(_MIN_NAME, width - rest), widths[:2], False)


def _column_names(layout: _Layout) -> str:
    """`GPU name | memory used / total | util | temp | power / limit`, each name over its
    column (spaces for the bars), shortened to its first word where the column is narrow."""
    index, name, *cells = COLUMN_NAMES
    line = f"{index:<{layout.index_width}} {name:<{layout.name_width}}"
    for number, cell_width in enumerate(layout.cell_widths):
        width = cell_width + (_BAR_WIDTH + 1 if number == 0 and layout.bar else 0)
        named = cells[number]
        label = named if len(named) <= width else named.split()[0]
        line += "   " + (f"{label:<{width}}" if named in _NAMES_LEFT else f"{label:>{width}}")
    return line.rstrip()


def _readable(gpu: GpuSample) -> bool:
    return gpu.error is None or gpu.memory_total_bytes is not None


def _gpu_line(gpu: GpuSample, layout: _Layout, style: Style) -> str:
    index = style.paint(f"[{gpu.index}]".ljust(layout.index_width), BOLD)
    name = _short_name(gpu.name or _MISSING, layout.name_width, style)
    head = f"{index} {name.ljust(layout.name_width)}"
    if not _readable(gpu):
        room = layout.name_width + sum(3 + w for w in layout.cell_widths) - len(name) - 3
        error = _cut("error: " + (gpu.error or ""), max(room, 10), style)
        return f"{index} {name} | {style.paint(error, BOLD, RED)}"
    cells = _cells(gpu, style, bar=layout.bar)
    line = head + "".join(
        " | " + cell.padded(w + (_BAR_WIDTH + 1 if i == 0 and layout.bar else 0))
        for i, (cell, w) in enumerate(zip(cells, layout.cell_widths, strict=False))
    )
    if gpu.error is not None:
        line += " | " + style.paint("error: " + gpu.error, RED)
    return line


def _short_name(name: str, width: int, style: Style) -> str:
    """A GPU's name within `width`: "NVIDIA " goes first, then the end."""
    if len(name) > width:
        name = name.removeprefix("NVIDIA ")
    return _cut(name, width, style)


def _cut(text: str, width: int, style: Style) -> str:
    """`text` within `width` columns, ending in an ellipsis when it was cut."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ("…" if style.unicode else "~")


def _cells(gpu: GpuSample, style: Style, *, bar: bool) -> list[_Cell]:
    return [
        _memory(gpu, bar, style),
        _utilization(gpu, style),
        _temperature(gpu, style),
        _power(gpu, style),
    ]


def _memory(gpu: GpuSample | MigDevice, with_bar: bool, style: Style) -> _Cell:
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    if used is None or total is None or total <= 0:
        return _Cell.of(_MISSING, style)
    fraction = min(1.0, max(0.0, used / total))
    text = f"{used / _GIB:5.1f} / {total / _GIB:5.1f} GiB"
    level = _level(fraction, 0.5, 0.8)
    if not with_bar:
        return _Cell.of(text, style, level)
    full, empty = ("█", "░") if style.unicode else ("#", ".")
    filled = round(fraction * _BAR_WIDTH)
    bar = full * filled + empty * (_BAR_WIDTH - filled)
    painted = style.paint(full * filled, level) + style.paint(empty * (_BAR_WIDTH - filled), DIM)
    return _Cell(f"{bar} {text}", f"{painted} {style.paint(text, level)}")


def _utilization(gpu: GpuSample, style: Style) -> _Cell:
    if gpu.utilization_pct is None:
        # The driver reports no utilization for a MIG-enabled GPU: say why there is none.
        return _Cell.of("MIG" if gpu.mig_enabled else _MISSING, style)
    level = _level(gpu.utilization_pct / 100, 0.3, 0.8)
    return _Cell.of(f"{gpu.utilization_pct:3d}%", style, level)


def _temperature(gpu: GpuSample, style: Style) -> _Cell:
    if gpu.temperature_c is None:
        return _Cell.of(_MISSING, style)
    degree = "°C" if style.unicode else "C"
    level = _level(gpu.temperature_c, 60, 80)
    return _Cell.of(f"{gpu.temperature_c:2d}{degree}", style, level)


def _power(gpu: GpuSample, style: Style) -> _Cell:
    draw = _MISSING if gpu.power_w is None else f"{gpu.power_w:.0f}"
    limit = _MISSING if gpu.power_limit_w is None else f"{gpu.power_limit_w:.0f}"
    return _Cell.of(f"{draw:>4} / {limit:>4} W", style)


def _process_line(process: ProcessUsage, style: Style, width: int) -> str:
    memory = (
        _MISSING if process.memory_used_bytes is None else format_size(process.memory_used_bytes)
    )
    user = style.paint(f"{process.user or '?':<10}", CYAN)
    head = f"    {user} {process.pid:>8}  {memory:>9}  "
    room = max(0, width - 4 - 10 - 1 - 8 - 2 - 9 - 2)
    if process.command is None:
        return head + style.paint(_cut(_MISSING, room, style), DIM)
    return head + _cut(process.command, room, style)


def _lease_line(lease: Lease, style: Style, width: int) -> str:
    how = "exclusive" if lease.mem_bytes is None else f"shared, {format_size(lease.mem_bytes)}"
    since = time.strftime("%H:%M", time.localtime(lease.started_at))
    text = f"leased by {lease.user} (pid {lease.pid}, {how}, since {since}): {lease.command}"
    return style.paint(_cut(f"    {text}", width, style), YELLOW)


def _job_line(gpu: GpuSample, jobs: NodeJobs, style: Style, width: int, now: float) -> list[str]:
    """`  job 1234 alice  train-llm  2:13:05 left  allocated, idle 12m`: the name is cut
    first, then left out, when the line is too wide."""
    job = jobs.job_of(gpu)
    if job is None:
        return []
    head = f"  {job.heading}"
    left = time_left_text(job, now)
    idle_s = jobs.idle_s(gpu)
    idle = idle_text(idle_s) if idle_s is not None else ""
    tail = "".join(f"  {part}" for part in (left, idle) if part)
    room = width - len(head) - len(tail) - 2
    name = (job.name or "") if job.pod is None else ""  # a pod's is its container, said
    line = style.paint(head, BOLD)
    if name and room >= _MIN_NAME:
        line += "  " + _cut(name, room, style)
    if left:
        line += f"  {left}"
    if idle:
        line += "  " + style.paint(idle, YELLOW)
    if len(head) + len(tail) > width:  # too narrow even without the name: one cut line
        plain = _cut(head + tail, width, style)
        return [style.paint(plain, YELLOW if idle else BOLD)]
    return [line]


def _level(value: float, warn: float, alarm: float) -> str:
    return GREEN if value < warn else YELLOW if value < alarm else RED
