"""Per-module memory for sampled steps: hooks put on for one step and taken off after it.

Forward: a pre-hook and a hook on each module. Backward: hooks on tensors, not
on modules. A hook on each tensor a module outputs marks the start of its
backward (the gradient of its output is ready); hooks on its inputs and
parameters mark the end (their gradients are ready). Full backward hooks on
modules are not used: they wrap each output in a function that makes a
following in-place op (`ReLU(inplace=True)`) fail.

Memory is read from a probe: the allocator's `allocated_now()` when it sees
every tensor of the device (CUDA); otherwise a running count of the bytes of
the tensors modules produce, each storage counted once, which is what the
figures are on a CPU. A module's peak is the highest reading seen at any hook
while it ran, above its start: a floor of the true peak, which no hook sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuwatch.torch.stats import StatsSource
from gpuwatch.training import ModuleMemory


@dataclass
class _Frame:
    name: str
    start: int
    high: int
    pending_ends: int = 0


@dataclass
class _Record:
    forward_delta: int = 0
    forward_peak: int = 0
    backward_delta: int | None = None
    backward_peak: int | None = None


class ModuleSampler:
    """Measures every module of `model` during the steps between `install()` and `remove()`."""

    def __init__(self, model: Any, source: StatsSource | None) -> None:
        self._modules: list[tuple[str, Any]] = [
            (name or type(model).__name__, module) for name, module in model.named_modules()
        ]
        allocated: Callable[[], int] | None = (
            source.allocated_now if source is not None and source.tracks_tensors else None
        )
        self._allocated = allocated
        self._handles: list[Any] = []
        self._reset()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def hook_count(self) -> int:
        return len(self._handles)

    def install(self) -> None:
        """Puts the forward hooks and the parameters' gradient hooks on."""
        if self._handles:
            return
        for name, module in self._modules:
            self._handles.append(module.register_forward_pre_hook(partial(self._before, name)))
            self._handles.append(module.register_forward_hook(partial(self._after, name)))
            for parameter in module.parameters():
                if parameter.requires_grad:
                    self._handles.append(parameter.register_hook(partial(self._grad_in, name)))
                    self._params[name] = self._params.get(name, 0) + 1

    def remove(self) -> list[ModuleMemory]:
        """Takes every hook off (tensor hooks included); returns what the step measured,
        the modules with the highest peak first."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        measured = [
            ModuleMemory(
                name,
                record.forward_delta,
                max(record.forward_peak, 0),
                record.backward_delta,
                None if record.backward_peak is None else max(record.backward_peak, 0),
            )
            for name, record in self._records.items()
        ]
        self._reset()
        return sorted(measured, key=lambda module: module.peak_bytes, reverse=True)

    def _reset(self) -> None:
        self._records: dict[str, _Record] = {}
        self._open: list[_Frame] = []
        self._backward: dict[str, _Frame] = {}
        self._params: dict[str, int] = {}
        self._seen: set[int] = set()
        self._produced = 0

    def _before(self, name: str, module: Any, args: Any) -> None:
        now = self._read()
        self._open.append(_Frame(name, now, now))
        for tensor in _tensors(args):
            if tensor.requires_grad:
                self._handles.append(tensor.register_hook(partial(self._grad_in, name)))
                self._params[name] = self._params.get(name, 0) + 1

    def _after(self, name: str, module: Any, args: Any, output: Any) -> None:
        outputs = list(_tensors(output))
        self._count(outputs)
        now = self._read()
        frame = next((f for f in reversed(self._open) if f.name == name), None)
        if frame is None:
            return
        self._open.remove(frame)
        record = self._records.setdefault(name, _Record())
        record.forward_delta += now - frame.start
        record.forward_peak = max(record.forward_peak, frame.high - frame.start)
        for tensor in outputs:
            if tensor.requires_grad:
                self._handles.append(tensor.register_hook(partial(self._grad_out, name)))

    def _grad_out(self, name: str, grad: Any) -> None:
        """The gradient of a module's output is ready: its backward starts."""
        self._count([grad])
        now = self._read()
        if name not in self._backward:
            frame = _Frame(name, now, now, pending_ends=self._params.get(name, 0))
            self._backward[name] = frame
            self._open.append(frame)

    def _grad_in(self, name: str, grad: Any) -> None:
        """The gradient of a module's input or parameter is ready: part of its backward ends."""
        self._count([grad])
        now = self._read()
        frame = self._backward.get(name)
        record = self._records.get(name)
        if frame is None or record is None:
            return
        record.backward_delta = now - frame.start
        record.backward_peak = max(record.backward_peak or 0, frame.high - frame.start)
        frame.pending_ends -= 1
        if frame.pending_ends <= 0 and frame in self._open:
            self._open.remove(frame)

    def _count(self, tensors: list[Any]) -> None:
        if self._allocated is not None:
            return
        for tensor in tensors:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
                continue
            if (pointer := storage.data_ptr()) not in self._seen:
                self._seen.add(pointer)
                self._produced += storage.nbytes()

    def _read(self) -> int:
        now = self._allocated() if self._allocated is not None else self._produced
        for frame in self._open:
            frame.high = max(frame.high, now)
        return now


def _tensors(value: Any, depth: int = 0) -> Iterator[Any]:
    """The tensors in a module's arguments or output (nested tuples, lists and dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth + 1)
