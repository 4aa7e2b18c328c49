"""`gpuwatch.select()` and `gpuwatch.device()` at the top of a script."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

import gpuwatch
from gpuwatch import selection as selection_module
from gpuwatch.errors import (
    AlreadySelectedError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    InvalidValueError,
    NotEnoughGpusError,
)
from gpuwatch.leases import LeaseDir
from tests.fake_nvml import FakeNvml


@pytest.fixture(autouse=True)
def clean_process_state() -> Iterator[None]:
    """Each test starts as a fresh script would: nothing selected, no CUDA variables."""
    yield
    if selection_module._this_process.selection is not None:
        selection_module._this_process.selection.release()
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        os.environ.pop(name, None)


def test_select_sets_visible_devices_and_holds_the_lease(lease_dir: Path) -> None:
    selection = gpuwatch.select(2, sim=4)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(selection.uuids)
    leases = LeaseDir(lease_dir).leases()
    assert {lease.gpu_uuid for lease in leases} == set(selection.uuids)
    assert {lease.pid for lease in leases} == {os.getpid()}


SELECT_AND_HOLD = """
import sys, time, gpuwatch
print(gpuwatch.select(int(sys.argv[1]), sim=4).indices, flush=True)
sys.stdin.read()
"""


def test_a_job_started_while_another_holds_gpus_gets_the_others() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    command = [sys.executable, "-c", SELECT_AND_HOLD]
    with subprocess.Popen(
        [*command, "2"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as first:
        assert first.stdout is not None and first.stdin is not None
        first_gpus = eval(first.stdout.readline())
        second = subprocess.run(
            [*command, "2"], env=env, input="", capture_output=True, text=True, check=True
        )
        first.stdin.close()
    assert sorted(first_gpus + eval(second.stdout)) == [0, 1, 2, 3]


def test_a_child_process_may_select_among_its_parents_gpus() -> None:
    # GIVEN a script holding GPU 3, WHEN it starts a worker that calls select() again
    # (as spawned DataLoader or DDP workers re-running the script's top do)
    parent = gpuwatch.select(sim=4)
    child = subprocess.run(
        [sys.executable, "-c", SELECT_AND_HOLD, "1"],
        input="",
        capture_output=True,
        text=True,
        check=True,
    )
    # THEN the worker gets the GPU its parent leased, not a refusal
    assert eval(child.stdout) == parent.indices == [3]


def test_index_format_sets_the_device_order_too() -> None:
    selection = gpuwatch.select(sim=4, format="index")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == str(selection.indices[0])
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_existing_visible_devices_is_never_widened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        InvalidValueError, match="3 GPUs asked for, but CUDA_VISIBLE_DEVICES allows 2"
    ):
        gpuwatch.select(3, sim=4)
    assert gpuwatch.select(sim=4).indices == [1]


def test_refuses_once_torch_has_initialised_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(CudaAlreadyInitializedError, match="torch has initialised CUDA"):
        gpuwatch.select(sim=4)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_works_when_torch_is_imported_but_cuda_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert len(gpuwatch.select(sim=4)) == 1


def test_selecting_twice_is_refused_until_released() -> None:
    first = gpuwatch.select(sim=4)
    with pytest.raises(AlreadySelectedError, match=r"already chose GPUs \[3\]"):
        gpuwatch.select(sim=4)
    first.release()
    assert gpuwatch.select(sim=4).indices == [3]


def test_fallback_cpu_gives_an_empty_selection_without_a_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound).install(monkeypatch)
    with pytest.raises(DriverNotFoundError):
        gpuwatch.select()
    selection = gpuwatch.select(fallback="cpu")
    assert selection.gpus == () and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_fallback_cpu_does_not_hide_busy_gpus() -> None:
    with pytest.raises(NotEnoughGpusError):
        gpuwatch.select(sim=4, min_free="80GiB", fallback="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "ask for at least 1 GPU"),
        ({"min_free": "8XB"}, "min_free: '8XB' is not a size"),
        ({"max_util": 120}, "percentage from 0 to 100"),
        ({"strategy": "fastest"}, "choose one of most-free, least-util, pack"),
        ({"fallback": "gpu"}, "choose one of error, cpu"),
        ({"format": "pci"}, "choose one of uuid, index"),
    ],
    ids=["n-zero", "bad-size", "bad-util", "bad-strategy", "bad-fallback", "bad-format"],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        gpuwatch.select(sim=4, **kwargs)  # type: ignore[arg-type]


def test_device_is_cpu_when_torch_cannot_use_cuda() -> None:
    torch = pytest.importorskip("torch")
    gpuwatch.select(sim=4)
    assert gpuwatch.device() == torch.device("cpu")  # the CPU build of torch


def test_device_selects_first_when_nothing_was_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("GPUWATCH_SIM", "2")
    gpuwatch.device()
    assert (
        selection_module._this_process.selection is not None
        and len(selection_module._this_process.selection) == 1
    )


def test_select_docstring_example_runs() -> None:
    results = doctest.testmod(selection_module, verbose=False)
    assert results.attempted >= 4 and results.failed == 0


def test_select_with_cpu_fallback_imports_no_torch_or_ui(tmp_path: Path) -> None:
    code = (
        "import sys, gpuwatch; gpuwatch.select(fallback='cpu');"
        "print(sorted(m for m in ('torch', 'textual', 'click') if m in sys.modules))"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}  # no NVIDIA library here
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("value", ["", "-1"], ids=["empty", "minus-one"])
def test_visible_devices_hiding_every_gpu_falls_back_to_cpu(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert gpuwatch.select(sim=4, fallback="cpu").gpus == ()
    selection_module._this_process.selection = None
    with pytest.raises(gpuwatch.NoGpuError, match="leaves no whole GPU"):
        gpuwatch.select(sim=4)


def test_release_gives_back_the_gpus_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    first = gpuwatch.select(sim=4, format="index")
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "GPUWATCH_HELD" in os.environ
    first.release()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and "GPUWATCH_HELD" not in os.environ
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert gpuwatch.select(2, sim=4).indices == [3, 2]


def test_a_failed_claim_leaves_no_lease_behind(
    monkeypatch: pytest.MonkeyPatch, lease_dir: Path
) -> None:
    real_claim = LeaseDir.claim
    claims = []

    def claim_then_fail(self: LeaseDir, *args: object, **kwargs: object) -> object:
        if claims:
            raise gpuwatch.LeaseError("disk full")
        claims.append(real_claim(self, *args, **kwargs))  # type: ignore[arg-type]
        return claims[-1]

    monkeypatch.setattr(LeaseDir, "claim", claim_then_fail)
    with pytest.raises(gpuwatch.LeaseError, match="disk full"):
        gpuwatch.select(2, sim=4)
    assert LeaseDir(lease_dir).leases() == []
