"""Per-module memory: real hooks on real CPU models, on sampled steps only, and none left behind."""

from __future__ import annotations

import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from gpuwatch.torch import SimulatedAllocator, watch  # noqa: E402

pytestmark = pytest.mark.slow

BATCH = 16
FLOAT_BYTES = 4


def mlp(inplace: bool = False) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(inplace=inplace), nn.Linear(64, 128), nn.Linear(128, 1)
    )


def train_step(model: nn.Module, optimizer: Any) -> None:
    loss = model(torch.randn(BATCH, 32)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def hooks_on(model: nn.Module, optimizer: Any) -> int:
    """Every hook a watch could leave: forward, pre-forward, parameter and optimizer hooks."""
    count = len(optimizer._optimizer_step_post_hooks)
    for module in model.modules():
        count += len(module._forward_hooks) + len(module._forward_pre_hooks)
        count += len(module._backward_hooks) + len(module._backward_pre_hooks)
    for parameter in model.parameters():
        count += len(parameter._backward_hooks or {})
    return count


def test_modules_are_measured_by_the_tensors_they_produce_on_cpu() -> None:
    # GIVEN a CPU model watched per module
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=optimizer, per_module=True, publish=False) as memory:
        # WHEN one step runs
        train_step(model, optimizer)
        modules = {module.name: module for module in memory.last_modules}
    # THEN each layer's forward is the bytes of its output, and backward was seen
    assert modules["0 (Linear)"].forward_delta_bytes == BATCH * 64 * FLOAT_BYTES
    assert modules["2 (Linear)"].forward_delta_bytes == BATCH * 128 * FLOAT_BYTES
    assert modules["Sequential"].forward_peak_bytes >= BATCH * (64 + 128) * FLOAT_BYTES
    assert modules["2 (Linear)"].backward_peak_bytes is not None
    assert modules["2 (Linear)"].backward_peak_bytes > 0
    # AND the largest module comes first
    assert memory.last_modules[0].name == "Sequential"


def test_hooks_are_on_only_for_sampled_steps() -> None:
    # GIVEN a watch sampling every third step
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=optimizer, per_module=True, every=3, publish=False) as memory:
        on_during = []
        for _ in range(7):
            on_during.append(memory.hooks_installed > 0)
            train_step(model, optimizer)
        # THEN steps 0, 3 and 6 carried hooks, the others none
        assert on_during == [True, False, False, True, False, False, True]
        assert memory.modules_step == 7


def test_inplace_activations_still_train_with_module_hooks() -> None:
    # GIVEN a model with ReLU(inplace=True), which module-wide full backward hooks break
    model = mlp(inplace=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # WHEN it trains watched per module, THEN nothing raises and the ReLU is measured
    with watch(model, optimizer=optimizer, per_module=True, publish=False) as memory:
        for _ in range(3):
            train_step(model, optimizer)
        assert "1 (ReLU)" in {module.name for module in memory.last_modules}


def test_the_inplace_regression_test_can_fail() -> None:
    # GIVEN the same model with a full backward hook on every module (what we avoid)
    model = mlp(inplace=True)
    for module in model.modules():
        module.register_full_backward_hook(lambda *args: None)
    # THEN the in-place op fails: the test above guards a real breakage
    with pytest.raises(RuntimeError, match=r"inplace|in-place"):
        model(torch.randn(BATCH, 32)).sum().backward()


@pytest.mark.parametrize("every", [1, 2], ids=["every-step", "every-2"])
def test_no_hook_is_left_after_close(every: int) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    memory = watch(model, optimizer=optimizer, per_module=True, every=every, publish=False)
    train_step(model, optimizer)
    model(torch.randn(BATCH, 32))  # a forward whose backward never comes
    memory.close()
    assert hooks_on(model, optimizer) == 0
    assert memory.hooks_installed == 0
    # no emptied hook dict left on a parameter either: autograd would call into it each step
    assert all(parameter._backward_hooks is None for parameter in model.parameters())


def test_no_hook_is_left_after_an_exception_in_the_loop() -> None:
    # GIVEN a loop that fails in the middle of a sampled step
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        with watch(model, optimizer=optimizer, per_module=True, source=SimulatedAllocator()):
            train_step(model, optimizer)
            model(torch.randn(BATCH, 32))
            raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        loop()
    # THEN the watch took every hook off on the way out
    assert hooks_on(model, optimizer) == 0


def test_evaluation_without_gradients_is_measured_forward_only() -> None:
    model = mlp()
    with watch(model, per_module=True, publish=False) as memory, torch.no_grad():
        model(torch.randn(BATCH, 32))
        memory.step()
    modules = {module.name: module for module in memory.last_modules}
    assert modules["0 (Linear)"].forward_delta_bytes == BATCH * 64 * FLOAT_BYTES
    assert modules["0 (Linear)"].backward_delta_bytes is None


class Allocating(nn.Module):
    """A layer that takes `nbytes` of the simulated device in forward and keeps it."""

    def __init__(self, sim: SimulatedAllocator, nbytes: int) -> None:
        super().__init__()
        self.sim, self.nbytes, self.linear = sim, nbytes, nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        self.sim.allocate(self.nbytes)
        return self.linear(x)


@pytest.mark.parametrize("started", [True, False], ids=["cuda-started", "cuda-not-started"])
def test_modules_are_measured_by_the_allocator_once_cuda_runs(started: bool) -> None:
    # GIVEN an allocator that sees every tensor (as CUDA's does), started or not yet
    sim = SimulatedAllocator(ready=started)
    sim.tracks_tensors = True
    model = nn.Sequential(Allocating(sim, 3 << 20), Allocating(sim, 1 << 20))
    with watch(model, per_module=True, source=sim, publish=False) as memory:
        model(torch.randn(4, 8))
        memory.step()
    modules = {module.name: module for module in memory.last_modules}
    if started:
        # THEN the figures are the allocator's
        assert modules["0 (Allocating)"].forward_delta_bytes == 3 << 20
        assert modules["Sequential"].forward_delta_bytes == 4 << 20
    else:
        # THEN, CUDA not running, they are the bytes of the tensors produced
        assert modules["0 (Allocating)"].forward_delta_bytes == 4 * 8 * FLOAT_BYTES


def test_a_module_with_an_unwieldy_name_still_publishes_a_readable_report(
    lease_dir: Any,
) -> None:
    from gpuwatch.reports.training import read_reports

    # GIVEN a module whose name is too long and holds a control character
    model = nn.Sequential()
    model.add_module("x" * 300 + "\x1b", nn.Linear(4, 4))
    with watch(model, per_module=True, source=SimulatedAllocator()) as memory:
        model(torch.randn(2, 4))
        memory.step()
        memory.publish_now()
        found = read_reports()
    # THEN readers accept the report, with the name cut and cleaned
    assert found.skipped == 0
    (report,) = found.reports
    assert any(m.name.startswith("xxx") and m.name.endswith("… (Linear)") for m in report.modules)


def sampled_figures(between_steps: Any, steps: int = 3, every: int = 1) -> list[Any]:
    """`last_modules` after `steps` training steps of a fresh model, `between_steps()` run
    after each step (and so inside the next sampled step's window)."""
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, optimizer=optimizer, per_module=True, every=every, publish=False) as memory:
        for _ in range(steps):
            model.train()
            train_step(model, optimizer)
            between_steps(model)
        return sorted(memory.last_modules, key=lambda module: module.name)


def evaluate(model: nn.Module) -> None:
    """An MNIST-style test(): eval mode, no gradients, several larger batches."""
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model(torch.randn(4 * BATCH, 32))


def evaluate_with_gradients_on(model: nn.Module) -> None:
    model.eval()
    for _ in range(3):
        model(torch.randn(4 * BATCH, 32))


@pytest.mark.parametrize("every", [1, 2], ids=["every-step", "every-2"])
@pytest.mark.parametrize(
    "evaluation", [evaluate, evaluate_with_gradients_on], ids=["no-grad", "eval-mode"]
)
def test_an_evaluation_loop_between_steps_adds_nothing_to_the_sampled_step(
    every: int, evaluation: Any
) -> None:
    # GIVEN the figures of a training without evaluation
    alone = sampled_figures(lambda model: None, every=every)
    # WHEN the same training runs an evaluation loop after every step
    with_evaluation = sampled_figures(evaluation, every=every)
    # THEN the sampled step's figures are the same: the evaluation's forwards are not in them
    assert with_evaluation == alone
    first = next(m for m in alone if m.name == "0 (Linear)")
    assert first.forward_delta_bytes == BATCH * 64 * FLOAT_BYTES


def test_with_gradient_accumulation_the_figures_are_one_micro_batch() -> None:
    # GIVEN one training step of one batch, and one of two micro-batches of the same size
    def accumulate(model: nn.Module, optimizer: Any) -> None:
        for _ in range(2):
            model(torch.randn(BATCH, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    figures = []
    for step in (train_step, accumulate):
        torch.manual_seed(0)
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, optimizer=optimizer, per_module=True, publish=False) as memory:
            step(model, optimizer)
            figures.append({m.name: m.forward_delta_bytes for m in memory.last_modules})
    # THEN each module's forward is that of one micro-batch: the first freed its memory
    assert figures[1] == figures[0]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x: Any) -> Any:
        return self.layers(x)


def test_modules_are_named_by_path_and_class() -> None:
    # GIVEN a model of nested modules
    model = Block()
    # WHEN a step is sampled
    with watch(model, per_module=True, publish=False) as memory:
        model(torch.randn(4, 8)).sum().backward()
        memory.step()
    # THEN each module is named by its path and its class, the model by its class
    assert {m.name for m in memory.last_modules} == {
        "Block", "layers (Sequential)", "layers.0 (Linear)", "layers.1 (ReLU)", "layers.2 (Linear)"
    }  # fmt: skip


def test_a_data_parallel_wrapper_is_seen_through() -> None:
    # GIVEN a model wrapped as DDP wraps it (DataParallel: the same `.module`, no process group)
    model = nn.DataParallel(Block())
    # WHEN a step is sampled
    with watch(model, per_module=True, publish=False) as memory:
        model(torch.randn(4, 8)).sum().backward()
        memory.step()
    names = [m.name for m in memory.last_modules]
    # THEN the model inside is named once, as without the wrapper, with no `module.` prefix
    assert sorted(names) == sorted(set(names))
    assert "Block" in names and "layers.0 (Linear)" in names
    assert not any("DataParallel" in name or name.startswith("module") for name in names)


class Nested(nn.Module):
    """A layer that calls the one below it: a model as deep as Python's stack allows."""

    def __init__(self, below: Nested | None) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.below = below

    def forward(self, x: Any) -> Any:
        x = self.layer(x)
        return x if self.below is None else self.below(x)


def nested(depth: int) -> Nested:
    model = None
    for _ in range(depth):  # bottom up: building it takes no recursion
        model = Nested(model)
    assert model is not None
    return model


def runs(model: nn.Module) -> bool:
    try:
        model(torch.randn(1, 2)).sum().backward()
    except RecursionError:
        return False
    return True


def deepest_that_runs() -> int:
    """The deepest `nested` model a step of runs here, without a watch."""
    low, high = 1, sys.getrecursionlimit()
    while low + 1 < high:
        middle = (low + high) // 2
        low, high = (middle, high) if runs(nested(middle)) else (low, middle)
    return low


def test_a_model_that_runs_without_the_watch_runs_under_it_per_module() -> None:
    # GIVEN the deepest recursive model that runs here without a watch
    limit = sys.getrecursionlimit()
    model = nested(deepest_that_runs())
    # WHEN a sampled step of it runs watched per module
    with watch(model, per_module=True, publish=False) as memory:
        ran = runs(model)
        memory.step()
    # THEN it runs, and is measured
    assert ran
    assert memory.last_modules
    # AND the recursion limit is the user's again
    assert sys.getrecursionlimit() == limit
