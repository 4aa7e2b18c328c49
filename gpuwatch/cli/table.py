"""`gpuwatch status` as a table: one line per GPU, one per process and lease under it.

A MIG-enabled GPU has one line per MIG device under it, with that device's
processes and leases under the device.

Pure text in, text out: colour is decided by the caller and passed in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessUsage, Snapshot
from gpuwatch.units import format_size

_GIB = float(1 << 30)
_BAR_WIDTH = 20
_NARROW = 90  # below this many columns the memory bar is left out
_MISSING = "-"


@dataclass(frozen=True, slots=True)
class Style:
    """How to draw: colour on or off, and whether the terminal takes block characters."""

    color: bool = False
    unicode: bool = True

    def paint(self, text: str, *codes: str) -> str:
        if not self.color or not codes:
            return text
        return f"\x1b[{';'.join(codes)}m{text}\x1b[0m"


BOLD, DIM, RED, GREEN, YELLOW, CYAN = "1", "2", "31", "32", "33", "36"


def render(
    snapshot: Snapshot,
    *,
    leases: Sequence[Lease] = (),
    style: Style = Style(),
    width: int = 120,
) -> str:
    """The whole table, ending in a newline."""
    lines = [_header(snapshot, style)]
    name_width = max((len(gpu.name or "") for gpu in snapshot.gpus), default=4)
    with_bar = width >= _NARROW
    for gpu in snapshot.gpus:
        lines.append(_gpu_line(gpu, name_width, with_bar, style))
        migs = snapshot.mig_devices_of(gpu.index)
        placed = {mig.uuid for mig in migs}
        outside = [p for p in snapshot.processes_on(gpu.index) if p.mig_uuid not in placed]
        lines.extend(_processes_and_leases(outside, gpu.uuid, leases, style, width))
        for mig in migs:
            lines.append(_mig_line(mig, with_bar, style))
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


def _mig_line(mig: MigDevice, with_bar: bool, style: Style) -> str:
    """`  0:2  1g.10gb   0.0 /   9.8 GiB  GI 13 CI 0`"""
    label = style.paint(f"{mig.label:>5}", BOLD)
    profile = _printable(mig.profile or mig.name or _MISSING)
    if mig.error is not None:
        return f"  {label}  {profile:<10} | {style.paint('error: ' + _printable(mig.error), RED)}"
    memory = _memory(mig, with_bar, style)
    ids = f"GI {_or_missing(mig.gpu_instance_id)} CI {_or_missing(mig.compute_instance_id)}"
    return f"  {label}  {profile:<10} | {memory} | {ids}"


def _or_missing(value: int | None) -> str:
    return _MISSING if value is None else str(value)


def _header(snapshot: Snapshot, style: Style) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.taken_at))
    parts = [style.paint(snapshot.hostname, BOLD), when]
    if snapshot.driver_version:
        parts.append(f"driver {snapshot.driver_version}")
    if snapshot.cuda_driver_version:
        parts.append(f"CUDA {snapshot.cuda_driver_version}")
    return "  ".join(parts)


def _gpu_line(gpu: GpuSample, name_width: int, with_bar: bool, style: Style) -> str:
    index = style.paint(f"[{gpu.index}]", BOLD)
    name = _printable(gpu.name or _MISSING).ljust(name_width)
    if gpu.error is not None and gpu.memory_total_bytes is None:
        return f"{index} {name} | {style.paint('error: ' + _printable(gpu.error), BOLD, RED)}"
    cells = [
        _memory(gpu, with_bar, style),
        _utilization(gpu, style),
        _temperature(gpu, style),
        _power(gpu),
    ]
    line = f"{index} {name} | " + " | ".join(cells)
    if gpu.error is not None:
        line += " | " + style.paint("error: " + _printable(gpu.error), RED)
    return line


def _memory(gpu: GpuSample | MigDevice, with_bar: bool, style: Style) -> str:
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    if used is None or total is None or total <= 0:
        return f"{_MISSING:>16}"
    fraction = used / total
    text = f"{used / _GIB:5.1f} / {total / _GIB:5.1f} GiB"
    if not with_bar:
        return style.paint(text, _level(fraction, 0.5, 0.8))
    full, empty = ("█", "░") if style.unicode else ("#", ".")
    filled = round(fraction * _BAR_WIDTH)
    bar = style.paint(full * filled, _level(fraction, 0.5, 0.8)) + style.paint(
        empty * (_BAR_WIDTH - filled), DIM
    )
    return f"{bar} {text}"


def _utilization(gpu: GpuSample, style: Style) -> str:
    if gpu.utilization_pct is None:
        # The driver reports no utilization for a MIG-enabled GPU: say why there is none.
        return " MIG" if gpu.mig_enabled else f"{_MISSING:>4}"
    return style.paint(f"{gpu.utilization_pct:3d}%", _level(gpu.utilization_pct / 100, 0.3, 0.8))


def _temperature(gpu: GpuSample, style: Style) -> str:
    if gpu.temperature_c is None:
        return f"{_MISSING:>4}"
    degree = "°C" if style.unicode else "C"
    return style.paint(f"{gpu.temperature_c:2d}{degree}", _level(gpu.temperature_c, 60, 80))


def _power(gpu: GpuSample) -> str:
    draw = _MISSING if gpu.power_w is None else f"{gpu.power_w:.0f}"
    limit = _MISSING if gpu.power_limit_w is None else f"{gpu.power_limit_w:.0f}"
    return f"{draw:>4} / {limit:>4} W"


def _process_line(process: ProcessUsage, style: Style, width: int) -> str:
    memory = (
        _MISSING if process.memory_used_bytes is None else format_size(process.memory_used_bytes)
    )
    user = style.paint(f"{_printable(process.user or '?'):<10}", CYAN)
    head = f"    {user} {process.pid:>8}  {memory:>9}  "
    command = _printable(process.command or _MISSING)
    room = max(10, width - 4 - 10 - 1 - 8 - 2 - 9 - 2)
    if len(command) > room:
        command = command[: room - 1] + ("…" if style.unicode else "~")
    return head + style.paint(command, DIM) if process.command is None else head + command


def _lease_line(lease: Lease, style: Style, width: int) -> str:
    how = "exclusive" if lease.mem_bytes is None else f"shared, {format_size(lease.mem_bytes)}"
    since = time.strftime("%H:%M", time.localtime(lease.started_at))
    text = _printable(
        f"leased by {lease.user} (pid {lease.pid}, {how}, since {since}): {lease.command}"
    )
    text = f"    {text}"
    return style.paint(text[:width], YELLOW)


def _printable(text: str) -> str:
    """`text` with control characters shown as `?`: commands and lease files come from other
    users, and an escape sequence in them must not reach this terminal."""
    return "".join("?" if ord(c) < 32 or 127 <= ord(c) < 160 else c for c in text)


def _level(value: float, warn: float, alarm: float) -> str:
    return GREEN if value < warn else YELLOW if value < alarm else RED
