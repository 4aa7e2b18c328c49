"""What the detail view says of one process: its graphs, and beyond its row, its parents
and environment.

Read from this machine through psutil, each part failing on its own
into a sentence (another user's environment is not readable, a process in
another container is not visible).
"""

from __future__ import annotations

import shlex

import msgspec
import psutil

from gpuwatch.leases.directory import user_name
from gpuwatch.text import printable
from gpuwatch.tui.common import render
from gpuwatch.tui.common.trends import ProcessTrend
from gpuwatch.tui.node.rows import Row

MAX_PARENTS = 32


class ProcessDetails(msgspec.Struct, frozen=True):
    command: str | None
    """The command line as typed (arguments quoted), when readable."""
    parents: tuple[str, ...]
    """`pid user name` of each ancestor, nearest first; or one line saying why not."""
    environment: tuple[str, ...]
    """`NAME=value` lines, sorted; or one line saying why not."""


def read_details(pid: int) -> ProcessDetails:
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        gone = ("not visible from this machine (another container, or it has exited)",)
        return ProcessDetails(None, gone, gone)
    return ProcessDetails(_command(process), _parents(process), _environment(process))


def _command(process: psutil.Process) -> str | None:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return None
    while argv and not argv[-1]:
        argv.pop()  # the kernel's terminating NUL, or a rewritten command line's padding
    return printable(shlex.join(argv)) if argv else None


def _parents(process: psutil.Process) -> tuple[str, ...]:
    try:
        parent = process.ppid()
    except psutil.Error as error:
        return (f"not readable: {type(error).__name__}",)
    lines: list[str] = []
    while parent > 0 and len(lines) < MAX_PARENTS:
        try:
            ancestor = psutil.Process(parent)
            with ancestor.oneshot():
                user = user_name(ancestor.uids().effective)
                lines.append(f"{parent:>8}  {user:<10} {printable(ancestor.name())}")
                parent = ancestor.ppid()
        except psutil.Error:
            lines.append(f"{parent:>8}  (not readable)")
            break
    return tuple(lines) or ("(none)",)


def _environment(process: psutil.Process) -> tuple[str, ...]:
    try:
        environment = process.environ()
    except psutil.AccessDenied:
        return ("not readable by you (only its owner and root may read it)",)
    except psutil.Error as error:
        return (f"not readable: {type(error).__name__}",)
    return tuple(printable(f"{name}={value}") for name, value in sorted(environment.items()))


def remote_details() -> ProcessDetails:
    elsewhere = ("on another machine: only what gpuwatch status reports there is shown",)
    return ProcessDetails(None, elsewhere, elsewhere)


def graphs_text(row: Row, trend: ProcessTrend | None, width: int, *, gone: bool) -> render.Line:
    """Its GPU memory and CPU over its last samples, one cell per sample."""
    spans: render.Line = []
    gpu = "-" if row.gpu is None else str(row.gpu)
    spans.append((f"pid {row.pid}", "heading"))
    spans.append((f"  user {row.user or '?'}  GPU {gpu}  {row.kind}", ""))
    if gone:
        spans.append(("  (no longer on the GPU)", "alarm"))
    spans.append(("\n", ""))
    cells = max(10, width - 14)
    memory = trend.memory_bytes.latest(cells) if trend else []
    cpu = trend.cpu_pct.latest(cells) if trend else []
    peak = max((v for v in memory if v is not None), default=0.0) or 1.0
    cpu_peak = max(100.0, max((v for v in cpu if v is not None), default=0.0))
    for title, values, top, now in (
        (
            "GPU memory",
            [None if v is None else v / peak for v in memory],
            render.size(int(peak)),
            render.size(row.gpu_memory_bytes),
        ),
        (
            "CPU",
            [None if v is None else v / cpu_peak for v in cpu],
            f"{cpu_peak:.0f}%",
            "-" if row.cpu_pct is None else f"{row.cpu_pct:.0f}%",
        ),
    ):
        spans.append((f"\n{title}: {now} now (top of graph {top}, one cell per sample)\n", ""))
        for line in render.sparkline(values, 3):
            spans.append((line + "\n", "graph-memory"))
    return spans


def details_text(row: Row, details: ProcessDetails) -> render.Line:
    """Its command, lease, idle time, parents and environment."""
    spans: render.Line = []
    spans.append(("\nCommand\n", "heading"))
    spans.append(
        (
            (details.command or row.command or "(not visible from here)") + "\n",
            "",
        )
    )
    if row.wants:
        spans.append((f"\nWaiting for: {row.wants}\n", ""))
    if row.lease:
        spans.append((f"\nLease: {row.lease}\n", ""))
    if row.idle is not None:
        prefix = "at least " if row.idle.at_least else ""
        idle = f"{prefix}{render.duration(row.idle.seconds)}"
        spans.append((f"\nIdle holder: its GPU has been idle for {idle}\n", "heading"))
    spans.append(("\nParents (nearest first)\n", "heading"))
    spans.append(("\n".join(details.parents) + "\n", ""))
    spans.append(("\nEnvironment\n", "heading"))
    spans.append(("\n".join(details.environment) + "\n", ""))
    return spans
