"""Training reports: the format round-trips, and files another user plants are ignored and counted.

No torch here: the daemon and the terminal UI read reports without it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuwatch.reports.training import (
    MAX_FILES_READ,
    MAX_MODULES,
    MEMORY_FIELDS,
    MemoryPoint,
    ModuleMemory,
    ReportFile,
    TrainingReport,
    read_reports,
    report_from_dict,
    reports_for_this_machine,
)


def a_report(**changes: Any) -> TrainingReport:
    values: dict[str, Any] = {
        "pid": os.getpid(),
        "rank": 0,
        "world_size": 1,
        "hostname": "node",
        "device": "cuda:0",
        "step": 12,
        "published_at": 1_790_000_000.0,
        "gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "step_time_s": 0.25,
        "allocated_bytes": 3 << 30,
        "allocated_peak_bytes": 5 << 30,
        "reserved_bytes": 6 << 30,
        "reserved_peak_bytes": 6 << 30,
        "active_bytes": 3 << 30,
        "active_peak_bytes": 5 << 30,
        "requested_bytes": (3 << 30) - 100,
        "inactive_split_bytes": 1 << 28,
        "alloc_retries": 2,
        "ooms": 0,
        "nvml_process_bytes": 7 << 30,
        "modules": (ModuleMemory("encoder.0", 1 << 20, 2 << 20, -(1 << 19), 3 << 20),),
        "modules_step": 10,
        "recent": (MemoryPoint(12, 3 << 30, 6 << 30, 5 << 30, 1 << 28),),
    }
    values.update(changes)
    return TrainingReport(**values)


def plant(directory: Path, name: str, content: bytes | str, *, hold: bool = True) -> int | None:
    """Writes a report file as another process would; holds its lock (as a live writer does)
    unless `hold` is False (a writer that died). Returns the descriptor that holds the lock."""
    directory.mkdir(mode=0o1777, exist_ok=True)
    path = directory / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if not hold:
        return None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.fixture
def held() -> Any:
    descriptors: list[int] = []
    yield descriptors
    for fd in descriptors:
        os.close(fd)


def test_a_report_round_trips_through_json() -> None:
    # GIVEN a report with every field set
    report = a_report()
    # WHEN it is written as JSON and read back
    back = report_from_dict(json.loads(json.dumps(report.to_dict())), user="alice")
    # THEN it is the same report, with the user the reader gave (never the file's)
    assert back == msgspec.structs.replace(report, user="alice")


def test_a_published_report_is_read_back_with_its_owner(lease_dir: Path) -> None:
    # GIVEN a process that published twice
    published = ReportFile()
    published.publish(a_report(step=1))
    published.publish(a_report(step=2))
    # WHEN a reader looks
    found = read_reports()
    # THEN it sees the newest report only, owned by this user, and skipped nothing
    assert [(r.step, r.pid) for r in found.reports] == [(2, os.getpid())]
    assert found.reports[0].user
    assert found.skipped == 0
    assert reports_for_this_machine() == found
    # WHEN the process stops publishing, THEN its report is gone
    published.close()
    assert read_reports().reports == ()


GOOD = a_report().to_dict()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("format", "something-else/1"),
        ("pid", 0),
        ("pid", True),
        ("pid", "123"),
        ("rank", 1),  # not below world_size
        ("world_size", 0),
        ("step", -1),
        ("step", 1.5),
        ("published_at", math.nan),
        ("published_at", 10**400),  # a JSON integer no float can hold
        ("step_time_s", math.inf),
        ("allocated_bytes", -1),
        ("allocated_bytes", 1 << 70),
        ("reserved_bytes", False),
        ("hostname", "evil\x1b[2J"),
        ("device", "x" * 300),
        ("notice", 42),
        ("modules", [{"name": "m"}]),
        ("modules", [GOOD["modules"][0]] * (MAX_MODULES + 1)),
        ("recent", [[1, 2, 3]]),
        ("recent", [[1, 2, 3, 4, -5]]),
        ("dropped_reports", None),
    ],
    ids=lambda value: repr(value)[:30],
)
def test_a_report_with_a_bad_field_is_skipped_and_counted(
    lease_dir: Path, held: list[int], field: str, value: Any
) -> None:
    # GIVEN a good report, and beside it one with a single bad field
    ReportFile().publish(a_report())
    bad = {**GOOD, field: value, "pid": GOOD["pid"] + 1 if field != "pid" else value}
    held.append(plant(lease_dir, "00000000000000000001-1-bad.training", json.dumps(bad)))
    # WHEN a reader looks
    found = read_reports()
    # THEN the good report is read, the bad one is skipped and counted
    assert [r.pid for r in found.reports] == [os.getpid()]
    assert found.skipped == 1


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b"{" * 100_000, b"\xff\xfe", json.dumps({"pid": 1}).encode()],
    ids=["not-json", "a-list", "deeply-nested", "not-utf8", "foreign-json"],
)
def test_corrupt_or_foreign_files_are_ignored(
    lease_dir: Path, held: list[int], content: bytes
) -> None:
    # GIVEN a corrupt file named like a report, held by a live process
    ReportFile().publish(a_report())
    held.append(plant(lease_dir, "00000000000000000001-1-x.training", content))
    # WHEN a reader looks, THEN it reads the good report and counts the other
    found = read_reports()
    assert len(found.reports) == 1
    assert found.skipped == 1


def test_a_report_left_by_a_dead_process_is_passed_over(lease_dir: Path) -> None:
    # GIVEN a valid report whose writer died (its lock is gone)
    ReportFile()  # creates the directory
    plant(lease_dir, "00000000000000000001-1-dead.training", json.dumps(GOOD), hold=False)
    # WHEN a reader looks, THEN the report is not shown
    found = read_reports()
    assert found.reports == ()
    assert found.skipped == 1


def test_symlinks_and_directories_named_like_reports_are_not_followed(
    lease_dir: Path, tmp_path: Path, held: list[int]
) -> None:
    # GIVEN a symlink to a valid, held report elsewhere, and a directory named like a report
    ReportFile()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(GOOD))
    fd = os.open(target, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    held.append(fd)
    (lease_dir / "00000000000000000001-1-link.training").symlink_to(target)
    (lease_dir / "00000000000000000002-1-dir.training").mkdir()
    # WHEN a reader looks, THEN neither is read
    found = read_reports()
    assert found.reports == ()
    assert found.skipped == 2


def test_a_flood_of_files_costs_a_bounded_number_of_reads(lease_dir: Path, held: list[int]) -> None:
    # GIVEN more planted report files than a reader reads, all held
    ReportFile()
    for index in range(MAX_FILES_READ + 10):
        data = {**GOOD, "pid": index + 1}
        held.append(plant(lease_dir, f"{index:020d}-1-x.training", json.dumps(data)))
    # WHEN a reader looks, THEN it reads the newest MAX_FILES_READ and counts the rest
    found = read_reports()
    assert len(found.reports) == MAX_FILES_READ
    assert found.skipped == 10


def test_no_lease_directory_means_no_reports(tmp_path: Path) -> None:
    assert read_reports(str(tmp_path / "absent")).reports == ()


def test_the_daemon_labels_each_report_with_the_nvml_index_of_its_gpu(lease_dir: Path) -> None:
    from prometheus_client.core import Metric

    from gpuwatch.backends import open_backend
    from gpuwatch.daemon.training_series import TrainingView, training_body, training_metrics

    # GIVEN a node whose GPU 1 a training uses, and a training on the CPU
    with open_backend(sim="2") as backend:
        snapshot = backend.sample()
    on_gpu = ReportFile()
    on_gpu.publish(a_report(gpu_uuid=snapshot.gpus[1].uuid))
    on_cpu = ReportFile()
    on_cpu.publish(a_report(pid=os.getpid() + 1, gpu_uuid=None, allocated_bytes=None))
    # WHEN the daemon answers /v1/training and /metrics
    body = training_body(snapshot, TrainingView().reports())
    indices = {gpu.uuid: gpu.index for gpu in snapshot.gpus}
    metrics: list[Metric] = list(training_metrics(read_reports(), indices, "node-1"))
    # THEN the GPU's report carries its index, the CPU's none, and metrics say the same
    assert [report["gpu"] for report in body["reports"]] == [1, None]
    allocated = next(m for m in metrics if m.name == "gpuwatch_torch_allocated_bytes")
    assert [(s.labels["gpu"], s.value) for s in allocated.samples] == [("1", 3 << 30)]
    names = {metric.name for metric in metrics}
    assert {f"gpuwatch_torch_{field}" for field in MEMORY_FIELDS} <= names
