"""Bars, graphs, numbers and colour levels, as plain text spans.

A span is (text, style name). The names ("ok", "warn", "alarm", "dim", ...)
are mapped to colours in `common.tcss`, so all style lives in one file and
this module stays testable without a terminal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import msgspec

from gpuwatch.models import GpuSample, Lease, MigDevice
from gpuwatch.units import format_size, format_span

Span = tuple[str, str]
Line = list[Span]

MISSING = "-"
_BLOCKS = " ▁▂▃▄▅▆▇█"
_USED, _RESERVED, _FREE = "█", "▓", "░"


class Thresholds(msgspec.Struct, frozen=True):
    """Where a value turns from ok to warn to alarm (fractions, or °C)."""

    busy: tuple[float, float] = (0.5, 0.9)
    memory: tuple[float, float] = (0.8, 0.95)
    """Nearly full."""
    temperature_c: tuple[float, float] = (75, 85)
    power: tuple[float, float] = (0.8, 0.95)


THRESHOLDS = Thresholds()


def level(value: float | None, limits: tuple[float, float]) -> str:
    """'ok', 'warn' or 'alarm' for `value` against (warn, alarm); 'dim' when unknown."""
    if value is None or math.isnan(value):
        return "dim"
    warn, alarm = limits
    return "alarm" if value >= alarm else "warn" if value >= warn else "ok"


def cells(total: int, parts: Sequence[float]) -> list[int]:
    """Splits `total` cells among `parts` (fractions of the whole; out-of-range ones clipped).

    Largest remainders get the leftover cells, and any non-zero part gets at
    least one cell when there is room, so a sliver of use is never drawn as none.
    """
    clipped = [min(1.0, max(0.0, p)) if math.isfinite(p) else 0.0 for p in parts]
    whole = sum(clipped)
    if whole > 1.0:  # a GPU reporting more used than it has: draw it full, not past the end
        clipped = [p / whole for p in clipped]
    exact = [p * total for p in clipped]
    counts = [math.floor(x) for x in exact]
    for i, x in enumerate(exact):
        if x > 0 and counts[i] == 0 and sum(counts) < total:
            counts[i] = 1
    spare = min(total, round(sum(exact))) - sum(counts)
    order = sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: max(0, spare)]:
        counts[i] += 1
    while sum(counts) > total:
        counts[counts.index(max(counts))] -= 1
    return counts


def memory_bar(gpu: GpuSample, width: int) -> Line:
    """Used, reserved and free memory as one bar of `width` cells."""
    total, used = gpu.memory_total_bytes, gpu.memory_used_bytes
    if not total or used is None or width <= 0:
        return [("·" * max(0, width), "dim")]
    reserved = gpu.memory_reserved_bytes or 0
    used_cells, reserved_cells = cells(width, [used / total, reserved / total])
    free_cells = max(0, width - used_cells - reserved_cells)
    tone = level(used / total, THRESHOLDS.memory)
    return [
        (_USED * used_cells, tone),
        (_RESERVED * reserved_cells, "reserved"),
        (_FREE * free_cells, "free"),
    ]


def percent_bar(pct: float | None, width: int, limits: tuple[float, float]) -> Line:
    """A bar `pct` percent full."""
    if pct is None or width <= 0:
        return [("·" * max(0, width), "dim")]
    (filled,) = cells(width, [min(100.0, pct) / 100])
    return [(_USED * filled, level(pct / 100, limits)), (_FREE * (width - filled), "free")]


def sparkline(values: Sequence[float | None], height: int = 1) -> list[str]:
    """A graph of values in [0, 1], `height` rows tall, top row first.

    Gaps (`None`) are blank; zero is the lowest block, so "idle" and "unknown" differ.
    """
    rows = []
    steps = len(_BLOCKS) - 1
    for row in range(height - 1, -1, -1):
        line = []
        for value in values:
            if value is None:
                line.append(" ")
                continue
            eighths = round(min(1.0, max(0.0, value)) * height * steps) - row * steps
            if row == 0:
                eighths = max(1, eighths)  # a known zero is a floor, unlike a gap
            line.append(_BLOCKS[min(steps, max(0, eighths))])
        rows.append("".join(line))
    return rows


def size(num_bytes: int | None) -> str:
    """`512.0MiB`, `61.5GiB`: sizes as `gpuwatch status` writes them."""
    return MISSING if num_bytes is None else format_size(num_bytes)


def duration(seconds: float | None) -> str:
    """`45s`, `12m`, `3h05m`, `2d04h`: a running or idle time."""
    if seconds is None or seconds < 0 or math.isnan(seconds):
        return MISSING
    return format_span(seconds)


def clock_time(timestamp: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


def fit(text: str, width: int) -> str:
    """`text` cut to `width` cells with an ellipsis, or padded to it."""
    if len(text) > width:
        return text[: max(0, width - 1)] + "…" if width > 0 else ""
    return text.ljust(width)


def lease_summary(leases: Sequence[Lease]) -> str:
    """`alice (exclusive)`, `bob 8.0G + carol 4.0G`: who holds a GPU through gpuwatch."""
    parts = []
    for lease in leases:
        how = "exclusive" if lease.mem_bytes is None else size(lease.mem_bytes)
        parts.append(f"{lease.user} ({how})")
    return " + ".join(parts)


class CardInput(msgspec.Struct, frozen=True):
    """What one GPU card shows besides the sample: graphs and leases."""

    memory_graph: Sequence[float | None] = ()
    utilization_graph: Sequence[float | None] = ()
    leases: Sequence[Lease] = ()
    idle_note: str = ""
    migs: Sequence[MigDevice] = ()
    """Its MIG devices, one line each under the card."""
    error_above: bool = False
    """Its error is the section's, said once in the header: the card only points there."""
    job: str = ""
    """The job holding it: `job 1234 alice`; empty for none."""
    job_left: str = ""
    """Its time left: `2:13:05 left`, `no time limit`."""
    allocated_idle: str = ""
    """`allocated, idle 12m` when a job holds it and has left it idle past the window."""


def gpu_card(
    gpu: GpuSample, extra: CardInput, width: int, graph_rows: int, *, compact: bool = False
) -> list[Line]:
    """One GPU as `2 + graph_rows` lines of `width` cells (one line when `compact`), and a
    line per MIG device."""
    if compact:
        return [crop(_compact_line(gpu, extra, width), width)] + [
            mig_line(mig, width) for mig in extra.migs
        ]
    lines = [_title_line(gpu, extra, width)]
    if gpu.error is not None and gpu.memory_total_bytes is None:
        body = "" if extra.error_above else f"  {_error_text(gpu, extra)}"  # title says it
        lines.append([(fit(body, width), "alarm")])
        lines.extend([[(" " * width, "")] for _ in range(graph_rows)])
        return [crop(line, width) for line in lines]
    lines.append(_bars_line(gpu, width))
    if graph_rows:
        lines.extend(_graph_lines(extra, width, graph_rows))
    lines.extend(mig_line(mig, width) for mig in extra.migs)
    return [crop(line, width) for line in lines]


def crop(line: Line, width: int) -> Line:
    """`line` cut to `width` cells (a card narrower than its fixed parts loses its end)."""
    out: Line = []
    room = width
    for text, style in line:
        if room <= 0:
            break
        out.append((text[:room], style))
        room -= len(text[:room])
    return out


def mig_line(mig: MigDevice, width: int) -> Line:
    """One MIG device under its GPU: `  0:2 1g.10gb  ███░░░ 3.1G/9.8G`."""
    head = f"  {mig.label:>5} {mig.profile or mig.name or MISSING:<10}"
    if mig.error is not None:
        return [
            (head, "label"),
            (fit(f" error: {mig.error}", width - len(head)), "alarm"),
        ]
    used, total = mig.memory_used_bytes, mig.memory_total_bytes
    numbers = f" {size(used):>7}/{size(total)}"
    bar_width = max(4, width - len(head) - len(numbers) - 1)
    fraction = used / total if used is not None and total else None
    if fraction is None:
        bar: Line = [("·" * bar_width, "dim")]
    else:
        (filled,) = cells(bar_width, [fraction])
        bar = [
            ("█" * filled, level(fraction, THRESHOLDS.memory)),
            ("░" * (bar_width - filled), "free"),
        ]
    return [(head + " ", "label"), *bar, (numbers, level(fraction, THRESHOLDS.memory))]


def graph_width(width: int) -> int:
    """Cells per graph in a card `width` wide (two graphs side by side)."""
    return max(4, (width - 11) // 2)


def _title_line(gpu: GpuSample, extra: CardInput, width: int) -> Line:
    head = f"[{gpu.index}] {gpu.name or MISSING}"
    temperature = gpu.temperature_c
    limit = gpu.power_limit_w
    hot = level(temperature, THRESHOLDS.temperature_c)
    power_fraction = gpu.power_w / limit if gpu.power_w is not None and limit else None
    facts: Line = [
        (f"{MISSING if temperature is None else temperature:>3}°C", hot),
        ("  ", ""),
        (_power_text(gpu), level(power_fraction, THRESHOLDS.power)),
    ]
    facts_width = sum(len(text) for text, _ in facts)
    room = width - facts_width - 2
    head_text = fit(head, min(len(head), max(0, room)))
    left = room - len(head_text)
    tail, tail_style = _tail(gpu, extra, left - 2)
    tail_text = fit(f"  {tail}", left) if tail and left > 4 else " " * max(0, left)
    return [(head_text, "title"), (tail_text, tail_style), ("  ", ""), *facts]


def _tail(gpu: GpuSample, extra: CardInput, room: int) -> tuple[str, str]:
    """What a card's title says after the name, and its style: an error, else the job
    holding it (first: on a Slurm node, who holds a GPU is the first question), its idle
    mark, the leases."""
    if gpu.error is not None:
        return _error_text(gpu, extra), "alarm"
    tail = lease_summary(extra.leases)
    tail_style = "lease"
    if extra.idle_note:
        tail, tail_style = f"{extra.idle_note}  {tail}".strip(), "warn"
    if not extra.job:
        return tail, tail_style
    idle = extra.allocated_idle
    # Narrower cards drop the time left, then say "idle 20m" for "allocated, idle 20m".
    for parts in (
        [extra.job, extra.job_left, idle, tail],
        [extra.job, idle, tail],
        [extra.job, idle.removeprefix("allocated, ")],
    ):
        said = "  ".join(part for part in parts if part)
        if len(said) <= room:
            break
    return said, "warn" if idle else "job"


def _error_text(gpu: GpuSample, extra: CardInput) -> str:
    return "error: see above" if extra.error_above else f"error: {gpu.error or ''}"


def _compact_line(gpu: GpuSample, extra: CardInput, width: int) -> Line:
    """`[0] H100 80GB HBM3  mem ███░░ 61.5GiB/79.6GiB  util ██░ 91%  70°C`."""
    name = (gpu.name or MISSING).removeprefix("NVIDIA ")
    head = fit(f"[{gpu.index}] {name}", max(8, min(20, width // 4)))
    if gpu.error is not None and gpu.memory_total_bytes is None:
        return [(head, "title"), (fit(f"  {_error_text(gpu, extra)}", width - len(head)), "alarm")]
    temperature = gpu.temperature_c
    hot = f"  {MISSING if temperature is None else temperature:>3}°C"
    job = _compact_job(extra)
    bars = _bars_line(gpu, width - len(head) - len(hot) - len(job[0]) - 2)
    return [
        (head, "title"),
        ("  ", ""),
        *bars,
        (hot, level(temperature, THRESHOLDS.temperature_c)),
        job,
    ]


def _compact_job(extra: CardInput) -> Span:
    """`  job 1234` (its id alone) at the end of a one-line card."""
    if not extra.job:
        return ("", "")
    return (f"  {extra.job.split(' ')[1]}", "warn" if extra.allocated_idle else "job")


def _power_text(gpu: GpuSample) -> str:
    draw = MISSING if gpu.power_w is None else f"{gpu.power_w:.0f}"
    if gpu.power_limit_w is None:  # an exporter that tells no limit: `644W`, not `644/-W`
        return f"{draw:>4}W"
    return f"{draw:>4}/{gpu.power_limit_w:.0f}W"


def _bars_line(gpu: GpuSample, width: int) -> Line:
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    numbers = f" {size(used):>7}/{size(total)}"
    util = gpu.utilization_pct
    util_text = f" {MISSING if util is None else util:>3}%"
    bar_room = width - len("mem ") - len(numbers) - len("  util ") - len(util_text)
    memory_width = max(4, bar_room * 3 // 5)
    util_width = max(4, bar_room - memory_width)
    return [
        ("mem ", "label"),
        *memory_bar(gpu, memory_width),
        (numbers, level(used / total if used is not None and total else None, THRESHOLDS.memory)),
        ("  util ", "label"),
        *percent_bar(util, util_width, THRESHOLDS.busy),
        (util_text, level(None if util is None else util / 100, THRESHOLDS.busy)),
    ]


def _graph_lines(extra: CardInput, width: int, rows: int) -> list[Line]:
    cells_each = graph_width(width)
    memory = sparkline(extra.memory_graph[-cells_each:], rows)
    busy = sparkline(extra.utilization_graph[-cells_each:], rows)
    lines = []
    for row in range(rows):
        label_a, label_b = ("mem ", " util ") if row == rows - 1 else ("    ", "      ")
        lines.append(
            [
                (label_a, "label"),
                (memory[row].ljust(cells_each), "graph-memory"),
                (" " + label_b, "label"),
                (busy[row].ljust(cells_each), "graph-util"),
            ]
        )
    return lines
