"""`gpuwatch.select()` and `gpuwatch.device()` at the top of a script."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

import gpuwatch
from gpuwatch.errors import (
    AlreadySelectedError,
    CudaAlreadyInitializedError,
    DriverNotFoundError,
    InvalidValueError,
    NotEnoughGpusError,
)
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.placement import selection as selection_module
from tests.helpers.fake_nvml import FakeNvml


@pytest.fixture(autouse=True)
def clean_process_state() -> Iterator[None]:
    """Each test starts as a fresh script would: nothing selected, no CUDA variables."""
    yield
    if selection_module._this_process.selection is not None:
        selection_module._this_process.selection.release()
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        os.environ.pop(name, None)


def test_select_sets_visible_devices_and_holds_the_lease(lease_dir: Path) -> None:
    selection = gpuwatch.select(2, sim=4, allow_busy=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(selection.uuids)
    leases = LeaseDir(lease_dir).leases()
    assert {lease.gpu_uuid for lease in leases} == set(selection.uuids)
    assert {lease.pid for lease in leases} == {os.getpid()}


def test_the_lease_names_the_script_as_a_shell_would_quote_it(
    lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a script started with an argument holding a space
    monkeypatch.setattr(sys, "argv", ["train.py", "--note", "first run"])
    # WHEN it selects a GPU THEN its lease shows the command as it was typed
    gpuwatch.select(sim=4)
    (lease,) = LeaseDir(lease_dir).leases()
    assert lease.command.endswith("train.py --note 'first run'")


SELECT_AND_HOLD = """
import sys, time, gpuwatch
busy = sys.argv[2:] == ["--allow-busy"]
print(gpuwatch.select(int(sys.argv[1]), sim=4, allow_busy=busy).indices, flush=True)
sys.stdin.read()
"""


def test_a_job_started_while_another_holds_gpus_gets_the_others() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    command = [sys.executable, "-c", SELECT_AND_HOLD]
    with subprocess.Popen(
        [*command, "2", "--allow-busy"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as first:
        assert first.stdout is not None and first.stdin is not None
        first_gpus = eval(first.stdout.readline())
        second = subprocess.run(
            [*command, "2", "--allow-busy"],
            env=env,
            input="",
            capture_output=True,
            text=True,
            check=True,
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
    assert gpuwatch.select(sim=4, allow_busy=True).indices == [1]


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


def test_selecting_again_with_the_same_arguments_returns_the_same_selection(
    lease_dir: Path,
) -> None:
    # GIVEN a notebook cell that selected a GPU
    first = gpuwatch.select(min_free="1GiB", sim=4)
    # WHEN the cell runs again, with the same wishes however they are written
    again = gpuwatch.select(1, min_free=1 << 30, sim="4", wait=True)
    # THEN it gets the same selection, and the process still holds one lease
    assert again is first
    assert len(LeaseDir(lease_dir).leases()) == 1


def test_selecting_again_differently_names_what_differs_until_released() -> None:
    first = gpuwatch.select(sim=4)
    # WHEN a second call asks for something else, THEN it is refused, saying what differs
    with pytest.raises(
        AlreadySelectedError,
        match=r"select\(n=2, strategy='pack'\) differs from the select\(n=1, "
        r"strategy='most-free'\) that chose GPUs \[3\].*\.release\(\)",
    ):
        gpuwatch.select(2, strategy="pack", sim=4)
    # AND once the first is released, the new wishes are met
    first.release()
    assert sorted(gpuwatch.select(2, strategy="pack", sim=8).indices) == [3, 7]


def test_selecting_again_after_cuda_started_still_returns_the_selection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a selection, and then CUDA started by the training that followed
    first = gpuwatch.select(sim=4)
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    # WHEN the notebook is run from the top again, THEN it keeps its GPUs
    assert gpuwatch.select(sim=4) is first


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
        # 79.5GiB: within the GPUs' 79.6GiB, more than any has free
        gpuwatch.select(sim=4, min_free="79.5GiB", fallback="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "ask for at least 1 GPU"),
        ({"min_free": "8XB"}, "min_free: '8XB' is not a size"),
        ({"max_util": 120}, "percentage from 0 to 100"),
        ({"strategy": "fastest"}, "choose one of most-free, least-util, pack"),
        ({"fallback": "gpu"}, "choose one of error, cpu"),
        ({"format": "pci"}, "choose one of uuid, index"),
        ({"mem": 0}, "declares no memory"),
        ({"mem": "0GiB"}, "declares no memory"),
        ({"min_free": "10"}, "min_free: '10' has no unit: write e.g. 10GiB"),
        ({"mem": "10"}, "mem: '10' has no unit"),
        ({"max_used": "2"}, "max_used: '2' has no unit"),
        ({"max_used": -1}, "max_used=-1: give bytes"),
        ({"allow_busy": "yes"}, "allow_busy: 'yes': give True or False"),
        ({"exclude": ""}, "exclude: '' has an empty entry"),
        ({"exclude": "1,,2"}, "exclude: '1,,2' has an empty entry"),
        ({"exclude": [-1]}, "exclude: -1 is not a GPU index"),
        ({"exclude": "12"}, "^exclude: no GPU 12 on this machine"),
    ],
    ids=[
        "n-zero",
        "bad-size",
        "bad-util",
        "bad-strategy",
        "bad-fallback",
        "bad-format",
        "mem-zero",
        "mem-zero-size",
        "min-free-without-unit",
        "mem-without-unit",
        "max-used-without-unit",
        "max-used-negative",
        "allow-busy-not-bool",
        "exclude-empty",
        "exclude-empty-entry",
        "exclude-negative",
        "exclude-string-is-one-list",
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        gpuwatch.select(sim=4, **kwargs)  # type: ignore[arg-type]


def test_device_on_a_cpu_build_of_torch_warns_and_gives_the_gpus_back(lease_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    # GIVEN GPUs selected, and a CPU-only build of torch (as in this test environment)
    selection = gpuwatch.select(2, sim=4, allow_busy=True)
    # WHEN the script asks for its device
    with pytest.warns(RuntimeWarning, match=r"CPU-only build; giving back GPUs \[3, 2\]"):
        first = gpuwatch.device()
    # THEN it computes on the CPU, and no longer keeps GPUs from other jobs
    assert first == torch.device("cpu")
    assert LeaseDir(lease_dir).leases() == []
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None
    assert selection.environment  # what it had set, for the record
    # AND asking again is quiet (pytest turns any further warning into an error)
    assert gpuwatch.device() == torch.device("cpu")


def test_device_selects_first_when_nothing_was_selected(
    monkeypatch: pytest.MonkeyPatch, lease_dir: Path
) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv("GPUWATCH_SIM", "4")
    with pytest.warns(RuntimeWarning, match=r"giving back GPUs \[3\]"):
        gpuwatch.device()  # selected GPU 3 (the idle one), which the CPU build cannot use
    assert selection_module._this_process.selection is not None
    assert LeaseDir(lease_dir).leases() == []


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


@pytest.mark.parametrize("value", ["-1", "", "-1,0"], ids=["minus-one", "empty", "minus-first"])
def test_visible_devices_hiding_every_gpu_means_no_gpu(
    monkeypatch: pytest.MonkeyPatch, fake_nvml: Callable[..., FakeNvml], value: str
) -> None:
    # GIVEN a script migrated from os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...),
    # run where CUDA_VISIBLE_DEVICES hides every GPU, on a GPU machine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    fake = fake_nvml()
    # WHEN it selects with a CPU fallback, THEN it gets the CPU, without reading the GPUs
    assert gpuwatch.select(fallback="cpu").gpus == ()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == value
    selection_module._this_process.selection = None
    # AND without one, the error quotes what was set
    with pytest.raises(gpuwatch.NoGpuError, match=f"CUDA_VISIBLE_DEVICES={value!r} hides every"):
        gpuwatch.select()
    assert fake.total_calls == 0


def test_not_enough_gpus_says_why_for_each_gpu() -> None:
    # GIVEN a node of 79.6GiB GPUs where none has 79.5GiB free, WHEN a script asks for it
    with pytest.raises(NotEnoughGpusError) as raised:
        gpuwatch.select(min_free="79.5GiB", sim=4)
    # THEN the message itself (what a traceback shows) carries pick's per-GPU reasons
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("1 idle GPU with 79.5GiB free wanted, 0 qualify; 3 GPUs in use")
    assert lines[1:] == [f"  {reason}" for reason in raised.value.reasons]
    assert len(lines) == 5 and lines[1].startswith("  GPU ")


def test_release_gives_back_the_gpus_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    first = gpuwatch.select(sim=4, format="index")
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "GPUWATCH_HELD" in os.environ
    first.release()
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and "GPUWATCH_HELD" not in os.environ
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert gpuwatch.select(2, sim=4, allow_busy=True).indices == [3, 2]


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
        gpuwatch.select(2, sim=4, allow_busy=True)
    assert LeaseDir(lease_dir).leases() == []


@pytest.mark.parametrize(
    "exclude", ["1,2", ["1", "2"], [1, 2], (1, "2")], ids=["text", "strings", "ints", "mixed"]
)
def test_exclude_takes_comma_separated_text_as_pick_does(exclude: object) -> None:
    # GIVEN the simulated 4-GPU node, GPUs 1 and 2 excluded
    selection = gpuwatch.select(2, sim=4, allow_busy=True, exclude=exclude)  # type: ignore[arg-type]
    # THEN the two others are chosen
    assert sorted(selection.indices) == [0, 3]


def test_select_takes_only_gpus_nobody_uses() -> None:
    # GIVEN the simulated 4-GPU node, where only GPU 3 is idle
    with pytest.raises(NotEnoughGpusError) as raised:
        gpuwatch.select(2, sim=4)
    assert "GPU 1: in use by svc-infer, pids 40100 40101, 36.0GiB used" in str(raised.value)
    assert gpuwatch.select(sim=4).indices == [3]


def test_processes_under_this_jobs_leases_are_its_own(lease_dir: Path) -> None:
    # GIVEN a worker this process started, and a process of someone else (init)
    from gpuwatch.models import ProcessKind, ProcessUsage, Snapshot
    from gpuwatch.placement.holding import own_pids

    with subprocess.Popen(["sleep", "30"]) as worker:
        snapshot = Snapshot(
            0.0,
            "node",
            None,
            None,
            (),
            tuple(
                ProcessUsage(pid, 0, "GPU-0", 1 << 30, ProcessKind.COMPUTE)
                for pid in (worker.pid, 1)
            ),
        )
        # THEN the worker is the job's own, init is not
        assert own_pids(snapshot, LeaseDir(lease_dir), frozenset()) == {worker.pid}
        worker.kill()
