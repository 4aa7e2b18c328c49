"""`gpuwatch.torch.watch()` per step, on real CPU models, with the simulated allocator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import gpuwatch  # noqa: E402
import gpuwatch.torch.watcher as watch_module  # noqa: E402
from gpuwatch.errors import InvalidValueError  # noqa: E402
from gpuwatch.reports.training import read_reports  # noqa: E402
from gpuwatch.torch import SimulatedAllocator, watch  # noqa: E402
from gpuwatch.torch.simulated import ROUND_BYTES, SEGMENT_BYTES  # noqa: E402

MiB = 1 << 20


def mlp(inplace: bool = False) -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(inplace=inplace), nn.Linear(64, 64), nn.Linear(64, 1)
    )


def train_step(model: nn.Module, optimizer: Any | None = None) -> None:
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize(
    ("request_bytes", "allocated", "reserved"),
    [
        (1, ROUND_BYTES, SEGMENT_BYTES),
        (1000, 1024, SEGMENT_BYTES),
        (3 * MiB + 1, 3 * MiB + ROUND_BYTES, 20 * MiB),
        (11 * MiB + 1, 11 * MiB + ROUND_BYTES, 12 * MiB),
    ],
    ids=["one-byte", "small", "large", "huge"],
)
def test_the_simulated_allocator_rounds_like_cuda(
    request_bytes: int, allocated: int, reserved: int
) -> None:
    sim = SimulatedAllocator()
    sim.allocate(request_bytes)
    stats = sim.read()
    assert (stats.allocated_bytes, stats.reserved_bytes) == (allocated, reserved)
    assert stats.requested_bytes == request_bytes


def test_each_step_publishes_the_allocators_counters(lease_dir: Path) -> None:
    # GIVEN a simulated device where a step leaves a split segment and triggers a retry
    sim = SimulatedAllocator(capacity_bytes=24 * MiB)
    model = mlp()
    with watch(model, source=sim) as memory:
        kept = sim.allocate(1 * MiB)  # a small segment, half used: fragmented
        spare = sim.allocate(4 * MiB)  # a 20 MiB segment
        sim.free(spare)  # cached, not returned
        big = sim.allocate(22 * MiB)  # does not fit beside the cache: retry, then fits
        train_step(model)
        memory.step()
        # WHEN the report is published
        memory.publish_now()
        (report,) = read_reports().reports
    # THEN it carries the counters of that step, and names the device
    assert report.step == 1
    assert report.device == "cuda:0"
    assert report.allocated_bytes == 23 * MiB
    assert report.reserved_bytes == 24 * MiB
    assert report.allocated_peak_bytes == 23 * MiB
    assert report.inactive_split_bytes == 1 * MiB
    assert report.alloc_retries == 1
    assert report.ooms == 0
    assert report.step_time_s is not None
    assert report.recent[-1].allocated_bytes == 23 * MiB
    assert kept and big  # both still live when read


def test_an_optimizer_ticks_the_watch_and_explicit_steps_do_not_double_count() -> None:
    # GIVEN a watch that knows the optimizer
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=optimizer, source=SimulatedAllocator(), publish=False) as memory:
        # WHEN three steps run, each also calling step() on the watch
        for _ in range(3):
            train_step(model, optimizer)
            memory.step()
        assert memory.steps == 3
        # AND a step the optimizer skipped (as AMP's scaler does) is counted by step()
        memory.step()
        assert memory.steps == 4
        # AND without step() calls the optimizer alone counts
        train_step(model, optimizer)
        train_step(model, optimizer)
        assert memory.steps == 6


@pytest.mark.parametrize("reset", [False, True], ids=["peaks-kept", "peaks-reset"])
def test_peaks_are_reset_only_when_asked(reset: bool) -> None:
    # GIVEN a peak of 10 MiB from before the watch's first step
    sim = SimulatedAllocator()
    block = sim.allocate(10 * MiB)
    sim.free(block)
    with watch(source=sim, publish=False, reset_peaks=reset) as memory:
        memory.step()
        memory.step()
    # THEN other tools still see the peak, unless resetting was asked for
    assert sim.read().allocated_peak_bytes == (0 if reset else 10 * MiB)


def test_the_watch_waits_for_cuda_and_never_starts_it(lease_dir: Path) -> None:
    # GIVEN a device whose CUDA has not started
    sim = SimulatedAllocator(ready=False)
    with watch(source=sim) as memory:
        memory.step()
        memory.publish_now()
        (before,) = read_reports().reports
        # THEN no counter is read and no OOM observer is attached yet
        assert before.allocated_bytes is None
        assert before.device == "cuda:0 (not started yet)"
        assert sim.observers == ()
        # WHEN CUDA starts (the program did it), THEN the next step reads it and attaches
        sim.is_ready = True
        memory.step()
        memory.publish_now()
        (after,) = read_reports().reports
        assert after.allocated_bytes == 0
        assert after.device == "cuda:0"
        assert len(sim.observers) == 1
    assert sim.observers == ()


def test_after_select_the_report_names_the_gpu_select_chose(lease_dir: Path) -> None:
    # GIVEN GPUs chosen by gpuwatch.select() on a simulated node
    selection = gpuwatch.select(1, sim="4")  # GPU 3, the idle one
    try:
        with watch(source=SimulatedAllocator()) as memory:
            memory.step()
            memory.publish_now()
            (report,) = read_reports().reports
    finally:
        selection.release()
    # THEN the report names the GPU by its uuid, which the daemon maps to its index
    assert report.gpu_uuid == selection.uuids[0]


def test_a_cpu_build_gives_one_notice_and_keeps_the_module_view(
    lease_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN torch without CUDA (this machine's build), no simulated source, no notice given yet
    assert torch.version.cuda is None
    monkeypatch.setattr(watch_module, "_noticed", set())
    model = mlp()
    with watch(model, per_module=True) as first:
        train_step(model)
        first.step()
        first.publish_now()
        (report,) = read_reports().reports
    with watch(model):
        pass
    # THEN one notice says what is missing, the report says it too, and modules are measured
    assert capsys.readouterr().err.count("no CUDA (a CPU build)") == 1
    assert report.notice is not None and "CPU build" in report.notice
    assert report.allocated_bytes is None
    assert report.device == "cpu"
    assert {m.name for m in report.modules} >= {"0 (Linear)", "2 (Linear)", "3 (Linear)"}


def test_without_torch_the_watch_counts_steps_after_one_notice(tmp_path: Path) -> None:
    # GIVEN a Python where torch cannot be imported
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import gpuwatch.torch\n"
        "with gpuwatch.torch.watch(publish=False) as memory:\n"
        "    memory.step(); memory.step()\n"
        "print('steps', memory.steps)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    # THEN it runs, says so once, and counts
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "steps 2"
    assert result.stderr.count("torch is not installed") == 1


@pytest.mark.parametrize("every", [0, -1, 1.5, True, "10"], ids=repr)
def test_every_must_be_a_whole_number_of_steps(every: Any) -> None:
    with pytest.raises(InvalidValueError, match="every="):
        watch(every=every, publish=False)


def test_the_watch_module_never_loads_with_gpuwatch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import gpuwatch, sys; print('gpuwatch.torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    assert out.stdout.strip() == "False"
