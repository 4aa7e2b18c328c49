"""Training reports: what `gpuwatch.torch.watch()` publishes, and the checked way to read them.

A training process publishes one small JSON report at most a few times a second
into the lease directory, as a `.training` file it keeps locked while it lives
(the same hostile-directory handling as leases, from `gpuwatch.leases.directory`): a
process that dies leaves an unlocked file, which readers pass over. Each
publish writes a new file and then removes the previous one, so a reader sees
either the old report or the new one, never half of one.

Every user can write into that directory, so nothing read from it is trusted:
a report is built field by field, each type- and range-checked, strings must be
printable and short, lists are capped; a file that fails any check is skipped
and counted. The user shown is the file's owner, not anything the file says.

This module imports neither torch nor anything heavy: the daemon and the
terminal UI read reports through it.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import msgspec

from gpuwatch.leases.directory import HeldFile, LeaseDir, user_name
from gpuwatch.record_fields import (
    MAX_BYTES,
    MAX_PID,
    BadRecord,
    Malformed,
    bytes_field,
    float_field,
    int_field,
    list_field,
    optional,
    text_field,
    time_field,
)
from gpuwatch.text import printable

FORMAT = "gpuwatch-training/1"
SUFFIX = "training"
MAX_MODULES = 20
MAX_POINTS = 120
MAX_FILES_READ = 256
"""A user who plants thousands of files costs a reader no more than this many reads."""
MAX_NAME_CHARS = 200
_MAX_WORLD = 1 << 20

MEMORY_FIELDS = (
    "allocated_bytes",
    "allocated_peak_bytes",
    "reserved_bytes",
    "reserved_peak_bytes",
    "active_bytes",
    "active_peak_bytes",
    "requested_bytes",
    "inactive_split_bytes",
)
"""The allocator's figures, in the order `gpuwatch torch-report` and the metrics use."""


class RankOfTraining(msgspec.Struct, frozen=True):
    """Which process of which training a report is from: one rank of `world_size`, on a
    host and a device. Training and out-of-memory reports begin with these fields."""

    pid: int
    rank: int
    world_size: int
    hostname: str
    device: str


def rank_fields(data: dict[str, Any]) -> tuple[int, int, int, str, str]:
    """The `RankOfTraining` fields of a report's decoded JSON, in order (the first fields of
    every report), checked; raises `BadRecord`."""
    world_size = int_field(data, "world_size", 1, _MAX_WORLD)
    return (
        int_field(data, "pid", 1, MAX_PID),
        int_field(data, "rank", 0, world_size - 1),
        world_size,
        text_field(data, "hostname"),
        text_field(data, "device"),
    )


class RankMemory(RankOfTraining, msgspec.Struct, frozen=True, kw_only=True):
    """A rank's memory on its GPU, as the allocator and the driver count it: the figures
    training and out-of-memory reports share, each `None` when unknown."""

    gpu_uuid: str | None = None
    allocated_bytes: int | None = None
    allocated_peak_bytes: int | None = None
    reserved_bytes: int | None = None
    requested_bytes: int | None = None
    inactive_split_bytes: int | None = None
    alloc_retries: int | None = None
    nvml_process_bytes: int | None = None


_RANK_MEMORY_SIZES = (
    "allocated_bytes",
    "allocated_peak_bytes",
    "reserved_bytes",
    "requested_bytes",
    "inactive_split_bytes",
    "nvml_process_bytes",
)


def rank_memory_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The `RankMemory` fields of a report's decoded JSON beyond `rank_fields`, by name,
    checked; raises `BadRecord`."""
    sizes = {name: optional(data, name, bytes_field) for name in _RANK_MEMORY_SIZES}
    return {
        **sizes,
        "alloc_retries": optional(data, "alloc_retries", int_field),
        "gpu_uuid": optional(data, "gpu_uuid", text_field),
    }


class ModuleMemory(msgspec.Struct, frozen=True):
    """One module's memory in a sampled step: change across its forward and backward, and
    the highest level above the start of each. Backward figures are `None` when its backward
    was not seen (evaluation, or no tensor of it needed a gradient)."""

    name: str
    forward_delta_bytes: int
    forward_peak_bytes: int
    backward_delta_bytes: int | None = None
    backward_peak_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_peak_bytes, self.backward_peak_bytes or 0)


class MemoryPoint(msgspec.Struct, frozen=True):
    """One point of the recent series: the allocator at `step`."""

    step: int
    allocated_bytes: int
    reserved_bytes: int
    allocated_peak_bytes: int
    inactive_split_bytes: int


class TrainingReport(RankMemory, msgspec.Struct, frozen=True):
    """One training process (one rank) as it last published itself.

    Allocator figures are `None` while CUDA is not in use (not yet initialised, a
    CPU build of torch, or no torch): `notice` then says why. `nvml_process_bytes`
    is this process's memory on its GPU as the driver counts it, CUDA context and
    every library included, so it is at least `reserved_bytes`.
    """

    step: int
    published_at: float
    step_time_s: float | None = None
    reserved_peak_bytes: int | None = None
    active_bytes: int | None = None
    active_peak_bytes: int | None = None
    ooms: int | None = None
    modules: tuple[ModuleMemory, ...] = ()
    modules_step: int | None = None
    recent: tuple[MemoryPoint, ...] = ()
    dropped_reports: int = 0
    notice: str | None = None
    oom_report: str | None = None
    user: str = ""
    """The report file's owner: filled in by the reader, never taken from the file."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["format"] = FORMAT
        data["recent"] = [list(msgspec.structs.astuple(point)) for point in self.recent]
        return data


class TrainingReports(msgspec.Struct, frozen=True):
    """What a reader found: live, valid reports (one per process and rank), and how many
    report files it passed over (malformed, out of range, foreign, or left by a dead process)."""

    reports: tuple[TrainingReport, ...] = ()
    skipped: int = 0


def report_from_dict(data: object, *, user: str = "") -> TrainingReport:
    """A report from decoded JSON, every field checked; raises `BadRecord`."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadRecord("not a gpuwatch training report")
    peaks = ("reserved_peak_bytes", "active_bytes", "active_peak_bytes")
    memory = rank_memory_fields(data) | {name: optional(data, name, bytes_field) for name in peaks}
    return TrainingReport(
        *rank_fields(data),
        step=int_field(data, "step"),
        published_at=time_field(data, "published_at"),
        step_time_s=optional(data, "step_time_s", _seconds),
        **memory,
        ooms=optional(data, "ooms", int_field),
        modules=tuple(module_from_dict(item) for item in list_field(data, "modules", MAX_MODULES)),
        modules_step=optional(data, "modules_step", int_field),
        recent=tuple(_point(item) for item in list_field(data, "recent", MAX_POINTS)),
        dropped_reports=int_field(data, "dropped_reports"),
        notice=optional(data, "notice", _long_text),
        oom_report=optional(data, "oom_report", _long_text),
        user=user,
    )


def read_reports(lease_dir: str | None = None) -> TrainingReports:
    """The live training reports on this machine, checked; never raises for a bad file.

    `lease_dir` defaults to the lease directory (`$GPUWATCH_LEASE_DIR`, ...).
    """
    directory = LeaseDir.read_only(lease_dir)
    if directory is None:
        return TrainingReports()
    try:
        names = sorted(
            entry.name for entry in os.scandir(directory.path) if entry.name.endswith(f".{SUFFIX}")
        )
    except OSError:
        return TrainingReports()
    newest: dict[tuple[int, int], TrainingReport] = {}
    valid = 0
    for name in names[-MAX_FILES_READ:]:
        found = _held_record(directory, os.path.join(directory.path, name))
        try:
            if found is None:
                continue
            report = report_from_dict(found[0], user=user_name(found[1]))
        except BadRecord:
            continue
        valid += 1
        newest[(report.pid, report.rank)] = report  # names sort oldest first
    reports = sorted(newest.values(), key=lambda r: (r.hostname, r.pid, r.rank))
    return TrainingReports(tuple(reports), skipped=len(names) - valid)


def _held_record(directory: LeaseDir, path: str) -> tuple[Any, int] | None:
    """(record, owner's uid) of a file a live process holds, through the lease directory's
    own reader (held regular files only, no symlinks, size capped); `None` for any other."""
    try:
        found = directory.read_held(path)
    except Malformed:  # not a record at all: as good as absent here
        return None
    if found is None:
        return None
    data, status = found
    return data, status.st_uid


def reports_for_this_machine() -> TrainingReports:
    """What the terminal UI's training panel shows: every live report in this machine's
    lease directory (containers that share it included), checked."""
    return read_reports()


class ReportFile:
    """This process's published report: each `publish()` replaces the previous one."""

    def __init__(self, lease_dir: str | None = None) -> None:
        self._directory = LeaseDir(lease_dir)  # raises LeaseError: creates it if need be
        self._held: HeldFile | None = None

    @property
    def path(self) -> str | None:
        return self._held.path if self._held is not None else None

    def publish(self, report: TrainingReport) -> None:
        """Writes `report` as a new locked file, then drops the previous one. Raises LeaseError."""
        # The lease directory's own writer: a locked draft, renamed into place once complete.
        fresh = self._directory.publish(SUFFIX, report.to_dict())
        previous, self._held = self._held, fresh
        if previous is not None:
            previous.release()

    def close(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


def this_hostname() -> str:
    return fit_name(socket.gethostname())


def fit_name(text: str) -> str:
    """`text` as a report may carry it: printable, and short enough for readers to accept."""
    shown = printable(text)
    return shown if len(shown) <= MAX_NAME_CHARS else shown[: MAX_NAME_CHARS - 1] + "…"


def module_from_dict(item: object) -> ModuleMemory:
    """A module's figures from decoded JSON, checked; raises `BadRecord`."""
    if not isinstance(item, dict):
        raise BadRecord("modules: not an object")
    return ModuleMemory(
        name=text_field(item, "name"),
        forward_delta_bytes=int_field(item, "forward_delta_bytes", -MAX_BYTES, MAX_BYTES),
        forward_peak_bytes=bytes_field(item, "forward_peak_bytes"),
        backward_delta_bytes=optional(item, "backward_delta_bytes", _signed_bytes),
        backward_peak_bytes=optional(item, "backward_peak_bytes", bytes_field),
    )


def _point(item: object) -> MemoryPoint:
    if not isinstance(item, list) or len(item) != len(MemoryPoint.__struct_fields__):
        raise BadRecord("recent: not a point")
    for value in item:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
            raise BadRecord(f"recent: {value!r:.40}")
    return MemoryPoint(*item)


def _signed_bytes(data: dict[str, Any], name: str) -> int:
    return int_field(data, name, -MAX_BYTES, MAX_BYTES)


def _seconds(data: dict[str, Any], name: str) -> float:
    return float_field(data, name, 0, 1e7)


def _long_text(data: dict[str, Any], name: str) -> str:
    return text_field(data, name, 4096)
