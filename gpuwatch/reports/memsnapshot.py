"""A summary of a CUDA memory snapshot (the pickle pytorch.org/memory_viz opens), without torch.

A pickle can run code when loaded, and a snapshot is a file someone hands you:
it is loaded with an unpickler that builds only plain data (dicts, lists,
strings, numbers) and refuses every class or function a pickle names. Torch
writes snapshots from plain data, so every real snapshot loads.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import msgspec

from gpuwatch.text import printable
from gpuwatch.units import format_size

MAX_FILE_BYTES = 4 << 30


class NotASnapshot(ValueError):
    """The file is not a memory snapshot, or names code to run."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise NotASnapshot(f"the pickle names {module}.{name}: only plain data is loaded")


class Block(msgspec.Struct, frozen=True):
    size_bytes: int
    where: str
    """The innermost frame that allocated it (`file:line function`), when history was on."""


class SnapshotSummary(msgspec.Struct, frozen=True):
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    largest: tuple[Block, ...]
    trace_entries: int
    ooms_in_trace: int

    def render(self) -> str:
        lines = [
            f"Memory snapshot: {self.segments} segments",
            f"  reserved             {format_size(self.reserved_bytes)}",
            f"  allocated            {format_size(self.allocated_bytes)}",
            f"  requested            {format_size(self.requested_bytes)}",
            f"  fragmented (free in split segments) {format_size(self.inactive_split_bytes)}",
            f"  history entries      {self.trace_entries} ({self.ooms_in_trace} OOM)",
        ]
        if self.largest:
            lines += ["", "Largest allocated blocks:"]
            lines += [f"  {format_size(b.size_bytes):>10}  {b.where}" for b in self.largest]
        lines += ["", "Open the file at https://pytorch.org/memory_viz for the full picture."]
        return "\n".join(lines)


def load(raw: bytes) -> dict[str, Any]:
    try:
        data = _PlainDataUnpickler(io.BytesIO(raw)).load()
    except NotASnapshot:
        raise
    except Exception as error:  # a truncated or foreign pickle fails in many ways
        raise NotASnapshot(f"not a pickle ({type(error).__name__})") from error
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise NotASnapshot("no `segments`: not a torch memory snapshot")
    return data


def summarize(data: dict[str, Any], top: int = 10) -> SnapshotSummary:
    """Totals and the largest blocks; malformed entries are passed over."""
    segments = [s for s in data["segments"] if isinstance(s, dict)]
    blocks = [
        (block, segment)
        for segment in segments
        for block in _list(segment, "blocks")
        if isinstance(block, dict)
    ]
    allocated = [b for b, _ in blocks if b.get("state") == "active_allocated"]
    split = sum(
        _int(b, "size")
        for b, segment in blocks
        if b.get("state") == "inactive" and _int(segment, "allocated_size") > 0
    )
    traces = [e for t in _list(data, "device_traces") if isinstance(t, list) for e in t]
    largest = sorted(allocated, key=lambda b: _int(b, "size"), reverse=True)[:top]
    return SnapshotSummary(
        segments=len(segments),
        reserved_bytes=sum(_int(s, "total_size") for s in segments),
        allocated_bytes=sum(_int(s, "allocated_size") for s in segments),
        requested_bytes=sum(_int(s, "requested_size") for s in segments),
        inactive_split_bytes=split,
        largest=tuple(Block(_int(b, "size"), _where(b)) for b in largest),
        trace_entries=len(traces),
        ooms_in_trace=sum(isinstance(e, dict) and e.get("action") == "oom" for e in traces),
    )


def _where(block: dict[str, Any]) -> str:
    for frame in _list(block, "frames"):
        if isinstance(frame, dict):
            place = f"{frame.get('filename', '?')}:{frame.get('line', '?')} {frame.get('name', '')}"
            return printable(place)[:200]
    return "(no history: record_history=True keeps where blocks came from)"


def _list(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    return value if isinstance(value, list) else []


def _int(data: dict[str, Any], name: str) -> int:
    value = data.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
