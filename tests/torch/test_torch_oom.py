"""At an out-of-memory error: the report, the snapshot, and `gpuwatch torch-report`."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.errors import GpuwatchError, InvalidValueError
from gpuwatch.reports.oom import OomReport, TensorSize, advice, read_report
from gpuwatch.reports.training import ModuleMemory, read_reports
from tests.helpers.cli import run_cli
from tests.helpers.files import what_is_at

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gpuwatch.torch import SimulatedAllocator, SimulatedOutOfMemory, watch  # noqa: E402

pytestmark = pytest.mark.slow

MiB = 1 << 20


def oom_in_training(tmp_path: Path, *, record_history: bool, ready: bool = True) -> Path:
    """Trains a CPU model on a simulated 64 MiB device until a request does not fit."""
    sim = SimulatedAllocator(capacity_bytes=64 * MiB, ready=ready)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    weights = torch.zeros(4 * MiB // 4)  # 4 MiB: the largest live tensor at the error

    def loop() -> None:
        with watch(
            model,
            optimizer=optimizer,
            per_module=True,
            oom_dir=tmp_path / "oom",
            record_history=record_history,
            source=sim,
        ):
            sim.allocate(1 * MiB)  # a small segment with room left: fragmentation
            for _ in range(2):
                model(torch.randn(64, 32)).sum().backward()
                optimizer.step()
            sim.allocate(40 * MiB)
            sim.allocate(30 * MiB)  # does not fit: the observer runs, then the error

    with pytest.raises(SimulatedOutOfMemory):
        loop()
    assert weights.numel()
    (report,) = (tmp_path / "oom").glob("*.json")
    return report


def test_an_oom_writes_a_report_that_explains_it(tmp_path: Path) -> None:
    # GIVEN a training that runs out of memory on the simulated device
    path = oom_in_training(tmp_path, record_history=False)
    # WHEN the report is read back
    report = read_report(str(path))
    # THEN it holds the request, the allocator's state, the modules and the tensors
    assert report.requested_bytes == 30 * MiB
    assert report.reserved_bytes == 42 * MiB
    assert report.device_free_bytes == 22 * MiB
    assert report.inactive_split_bytes == 1 * MiB
    assert report.alloc_retries == 1
    assert report.modules and report.modules[0].name == "Sequential"
    assert report.tensors[0].nbytes == 4 * MiB
    assert report.snapshot_path is None
    # AND a readable copy sits beside it, within a terminal's 80 columns
    text = path.with_suffix(".txt").read_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "requested            30.0MiB" in text
    assert "empty_cache() does not help" in text


def test_where_the_modules_explain_little_the_report_says_where_the_rest_is(
    tmp_path: Path,
) -> None:
    # GIVEN a training whose modules' activations come to some KiB, on a simulated 1100 MiB
    # device where the program keeps 1000 MiB alive between steps (in no tensor Python sees)
    sim = SimulatedAllocator(capacity_bytes=1100 * MiB)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=optimizer, per_module=True, oom_dir=tmp_path, source=sim):
        for _ in range(2):
            model(torch.randn(64, 32)).sum().backward()
            optimizer.step()
        sim.allocate(1000 * MiB)
        with pytest.raises(SimulatedOutOfMemory):
            sim.allocate(200 * MiB)
    # WHEN the user reads the report, as `gpuwatch torch-report` shows it
    (path,) = tmp_path.glob("*.json")
    shown = subprocess.run(
        [str(Path(sys.executable).with_name("gpuwatch")), "torch-report", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # THEN it says where the memory is: the modules' KiB, the 1000 MiB kept alive, no cache,
    # no other process; as the copy written beside it does
    assert shown == path.with_suffix(".txt").read_text()
    where = shown.split("Where the memory is:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert where[0].startswith("  the modules' activations (Sequential, at its peak)")
    assert where[0].endswith("KiB")
    assert where[1].split() == ["other", "tensors", "kept", "alive", where[1].split()[-1]]
    assert where[1].endswith("MiB") and float(where[1].split()[-1][:-3]) > 999
    assert where[2].split()[-1] == where[3].split()[-1] == "0B"
    # AND it advises on what holds it, not on the modules' activations
    fixes = " ".join(shown.split("What to do:\n", 1)[1].split())  # as one line
    assert fixes.startswith("- tensors kept alive outside the modules hold 999.")
    assert "autograd graph kept alive" in fixes and "loss.item()" in fixes
    assert "checkpointing" not in fixes and "a smaller batch" not in fixes


def test_with_history_the_oom_leaves_a_snapshot_torch_report_can_sum_up(
    tmp_path: Path,
) -> None:
    # GIVEN an OOM with history recording on
    report = read_report(str(oom_in_training(tmp_path, record_history=True)))
    assert report.snapshot_path is not None
    # WHEN torch-report reads the snapshot
    result = run_cli("torch-report", report.snapshot_path)
    # THEN it sums up the segments the device held
    assert result.exit_code == 0, result.stderr
    assert "reserved             42.0MiB" in result.stdout
    assert "40.0MiB" in result.stdout


def test_a_relative_oom_dir_is_where_it_was_when_the_watch_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a relative oom_dir, and a script that changes directory after the watch began
    # (as Hydra and some launchers do)
    (tmp_path / "later").mkdir()
    monkeypatch.chdir(tmp_path)
    sim = SimulatedAllocator(capacity_bytes=4 * MiB)
    with watch(source=sim, oom_dir="oom", record_history=True, publish=False) as memory:
        os.chdir(tmp_path / "later")
        with pytest.raises(SimulatedOutOfMemory):
            sim.allocate(8 * MiB)
    # THEN the report lands in the directory named at the start, and the paths it gives
    # (its own, the snapshot's) are whole ones that still open from anywhere
    assert memory.oom_report_path is not None
    report_path = Path(memory.oom_report_path)
    assert report_path.is_absolute() and report_path.parent == tmp_path / "oom"
    snapshot = read_report(str(report_path)).snapshot_path
    assert snapshot is not None and Path(snapshot).is_absolute() and Path(snapshot).is_file()


def test_an_oom_before_cuda_was_seen_is_reported_as_it_leaves_the_block(
    tmp_path: Path,
) -> None:
    # GIVEN an OOM on a device the watch never saw started (so no observer was attached)
    report = read_report(str(oom_in_training(tmp_path, record_history=False, ready=False)))
    # THEN the report still says what was asked for
    assert report.requested_bytes == 30 * MiB
    assert report.reserved_bytes is None


def test_the_published_report_points_at_the_oom_report(lease_dir: Path, tmp_path: Path) -> None:
    sim = SimulatedAllocator(capacity_bytes=4 * MiB)
    with watch(source=sim, oom_dir=tmp_path) as memory:
        memory.step()
        with pytest.raises(SimulatedOutOfMemory):
            sim.allocate(8 * MiB)
        memory.publish_now()
        (published,) = read_reports().reports
    assert published.ooms == 1
    assert published.oom_report == memory.oom_report_path


def test_torch_report_renders_an_oom_report(tmp_path: Path) -> None:
    path = oom_in_training(tmp_path, record_history=False)
    result = run_cli("torch-report", str(path))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Out of memory on cuda:0")
    assert "What to do:" in result.stdout


BASE = OomReport(
    pid=1, rank=0, world_size=1, hostname="h", device="cuda:0", at=1.0, step=3,
    requested_bytes=2 << 30, device_free_bytes=1 << 30, reserved_bytes=20 << 30,
    allocated_bytes=17 << 30, inactive_split_bytes=1 << 30, model_training=True,
    grad_enabled=True,
)  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "expected", "absent"),
    [
        ({"inactive_split_bytes": 3 << 30}, "expandable_segments:True", None),
        ({}, "a smaller batch", "expandable_segments"),
        ({"model_training": False}, "eval mode but gradients are on", None),
        ({"modules": (ModuleMemory("encoder", 1, 10 << 30),)}, "checkpointing", None),
        (
            {"modules": (ModuleMemory("encoder", 1, 81 << 10),)},
            "the live tensors Python can see hold only 0B of it",
            "checkpointing",
        ),
        (
            {
                "modules": (ModuleMemory("encoder", 1, 81 << 10),),
                "tensors": (TensorSize("(4096, 4096, 256)", "torch.float32", 16 << 30),),
            },
            "the largest live tensors above hold 16.0GiB of it",
            "a smaller batch",
        ),
        ({}, "empty_cache() does not help", None),
        ({"reserved_bytes": 1 << 20, "device_free_bytes": 1 << 20}, "other processes", None),
        (
            {"device_total_bytes": 80 << 30, "nvml_process_bytes": 21 << 30},
            "other processes hold most of this GPU",
            None,
        ),
        (
            {"device_total_bytes": 22 << 30, "nvml_process_bytes": 21 << 30},
            "",
            "other processes hold",
        ),
    ],
    ids=[
        "fragmented",
        "plain",
        "eval-with-grad",
        "modules",
        "modules-explain-little",
        "kept-tensors-seen",
        "empty-cache",
        "others",
        "others-by-the-gpus-size",
        "this-process-holds-the-gpu",
    ],
)
def test_the_advice_fits_the_error(
    changes: dict[str, object], expected: str, absent: str | None
) -> None:
    from msgspec.structs import replace

    fixes = " ".join(advice(replace(BASE, **changes)))  # type: ignore[arg-type]
    assert expected in fixes
    if absent is not None:
        assert absent not in fixes


@pytest.mark.parametrize(
    "content",
    [b"hello", json.dumps({"format": "gpuwatch-oom/1", "pid": -1}).encode()],
    ids=["text", "bad-oom-report"],
)
def test_torch_report_refuses_other_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "file"
    path.write_bytes(content)
    result = run_cli("torch-report", str(path))
    assert result.exit_code == ExitCode.USAGE
    assert "neither a gpuwatch OOM report" in result.stderr
    assert "Traceback" not in result.stderr


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("touch PWNED",))


def test_torch_report_never_runs_code_from_a_pickle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a "snapshot" that would run a command when unpickled
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Boom()]}))
    # WHEN torch-report reads it, THEN it refuses it and nothing ran
    result = run_cli("torch-report", str(path))
    assert result.exit_code == ExitCode.USAGE
    assert "only plain data" in result.stderr
    assert not (tmp_path / "PWNED").exists()


def test_a_program_that_survives_an_oom_gets_a_report_for_the_next_one(tmp_path: Path) -> None:
    # GIVEN a loop that catches an OOM, lowers its batch and later meets another
    sim = SimulatedAllocator(capacity_bytes=4 * MiB)
    with watch(source=sim, oom_dir=tmp_path, publish=False) as memory:
        for request in (8 * MiB, 1 * MiB, 16 * MiB):
            with contextlib.suppress(SimulatedOutOfMemory):
                sim.allocate(request)
            memory.step()
    # THEN each OOM has its own report
    requested = sorted(read_report(str(p)).requested_bytes or 0 for p in tmp_path.glob("*.json"))
    assert requested == [8 * MiB, 16 * MiB]


PLANTED = OomReport(
    pid=4242, rank=0, world_size=1, hostname="node1", device="cuda:0", at=1.79e9, step=812,
    requested_bytes=2 * MiB,
)  # fmt: skip


def test_a_file_planted_under_the_reports_name_is_left_alone(tmp_path: Path) -> None:
    from gpuwatch.reports.training import this_hostname
    from gpuwatch.torch.oom_writer import write_oom

    # GIVEN another user's file at the .json's exact name, and a link at the .txt's to a victim
    stem = tmp_path / f"gpuwatch-oom-{this_hostname()}-4242-rank0-step812-1790000000"
    planted = stem.with_name(stem.name + ".json")
    planted.write_text("planted")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    stem.with_name(stem.name + ".txt").symlink_to(victim)
    # WHEN the report is written
    written = Path(write_oom(PLANTED, str(tmp_path), snapshot={"segments": []}))
    # THEN neither planted file nor the link's target changed
    assert planted.read_text() == "planted"
    assert victim.read_text() == "precious"
    # AND the report, its text and its snapshot landed under one fresh name
    assert written != planted and written.name.startswith(stem.name + "-")
    assert read_report(str(written)).requested_bytes == 2 * MiB
    assert written.with_suffix(".txt").read_text().startswith("Out of memory on cuda:0")
    assert read_report(str(written)).snapshot_path == str(written.with_suffix(".pickle"))


def test_no_file_is_left_behind_under_a_name_that_was_passed_over(tmp_path: Path) -> None:
    from gpuwatch.torch.oom_writer import write_oom

    # GIVEN the .txt's name taken, the .json's free
    first = Path(write_oom(PLANTED, str(tmp_path), snapshot=None))
    first.with_suffix(".json").unlink()
    # WHEN another report with the same name is written
    second = Path(write_oom(PLANTED, str(tmp_path), snapshot=None))
    # THEN it is written whole elsewhere, and no empty .json is left under the first name
    assert second != first and not first.exists()
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".txt", ".txt"]


def make_file(path: Path) -> None:
    path.write_text("someone's notes")


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_others_link(path: Path) -> None:
    from tests.helpers.other_user import other_user

    elsewhere = path.parent / "elsewhere"
    elsewhere.mkdir()
    path.symlink_to(elsewhere)
    os.lchown(path, other_user().pw_uid, -1)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (make_file, "is a file, not a directory"),
        (make_fifo, "is a FIFO, not a directory"),
        (make_others_link, "is a symbolic link another user owns"),
    ],
    ids=["file", "fifo", "other-users-symlink"],
)
def test_an_oom_dir_that_is_no_directory_of_ours_is_refused_at_watch(
    tmp_path: Path, make: Any, why: str
) -> None:
    # GIVEN oom_dir naming a file, a FIFO, or a link another user planted
    path = tmp_path / "oom"
    make(path)
    before = what_is_at(path)
    # WHEN a watch starts, THEN it refuses in one line, and the path is as it was
    with pytest.raises(InvalidValueError, match=why) as refused:
        watch(source=SimulatedAllocator(capacity_bytes=4 * MiB), oom_dir=path, publish=False)
    assert "\n" not in str(refused.value)
    assert isinstance(refused.value, GpuwatchError)
    assert what_is_at(path) == before


def test_an_oom_dir_of_ones_own_through_a_link_is_used(tmp_path: Path) -> None:
    # GIVEN oom_dir a link of one's own to a directory
    (tmp_path / "scratch").mkdir()
    (tmp_path / "oom").symlink_to(tmp_path / "scratch")
    sim = SimulatedAllocator(capacity_bytes=4 * MiB)
    # WHEN an OOM happens, THEN its report lands in the directory linked to
    with (
        watch(source=sim, oom_dir=tmp_path / "oom", publish=False),
        contextlib.suppress(SimulatedOutOfMemory),
    ):
        sim.allocate(8 * MiB)
    assert len(list((tmp_path / "scratch").glob("*.json"))) == 1


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "oom_on_cpu.py"


def test_the_cpu_example_leaves_an_oom_report_that_torch_report_shows(tmp_path: Path) -> None:
    # GIVEN the example that runs out of a simulated GPU's memory, training on the CPU
    ran = subprocess.run(
        [sys.executable, str(EXAMPLE), "--oom-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # WHEN it has run, THEN it says where its report is, and how to read it
    assert ran.returncode == 0, ran.stderr
    (report,) = tmp_path.glob("gpuwatch-oom-*.json")
    assert f"gpuwatch torch-report {report}" in ran.stdout
    # AND the installed torch-report shows it: the request, the modules, what to do
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    shown = subprocess.run(
        [gpuwatch, "torch-report", str(report)], capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("Out of memory on cuda:0")
    assert "(Linear)" in shown.stdout and "What to do:" in shown.stdout


def test_the_guides_example_without_a_gpu_writes_an_oom_report(tmp_path: Path) -> None:
    # GIVEN the Python example of the training guide's "Try it without a GPU"
    guide = (EXAMPLE.parents[1] / "docs" / "guide" / "training.md").read_text()
    section = guide.split("## Try it without a GPU", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    # WHEN it runs, THEN it prints the report it wrote, which torch-report reads
    ran = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    report = Path(ran.stdout.strip().splitlines()[-1])
    assert report.parent == tmp_path and report.suffix == ".json"
    assert run_cli("torch-report", str(report)).stdout.startswith("Out of memory on cuda:0")
