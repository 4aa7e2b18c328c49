"""Per-module memory for sampled steps: hooks put on for one step and taken off after it.

Forward: a process-wide pre-hook and hook, which pass over other models'
modules. Backward: hooks on tensors, not on modules. A hook on each tensor a
module outputs marks the start of its backward (the gradient of its output is
ready); hooks on its inputs mark the end (their gradients are ready), or, for
a module whose inputs need no gradient (the first layer), hooks on its own
parameters. A module whose backward no hook closes (a container) ends with the
last gradient of the step. One hook per tensor serves every module waiting on
it. Full backward hooks on modules are not used: they wrap each output in a
function that makes a following in-place op (`ReLU(inplace=True)`) fail.

Memory is read from a probe: the allocator's `allocated_now()` when it sees
every tensor of the device (CUDA); otherwise a running count of the bytes of
the tensors modules produce (outputs and the gradients passed between modules),
each storage counted once while it lives, which is what the figures are on a
CPU. A module's peak is the highest reading seen at any hook while it ran,
above its start: a floor of the true peak, which no hook sees.

A hooked module's call runs one Python frame more than an unhooked one (torch's
`_call_impl` runs the hooks and `forward` in an inner function), so while the hooks
are on, the recursion limit is raised to keep the model's own headroom (`_headroom`).

The figures are one training pass's: the last forward (with its backward) of
the sampled step that ran with gradients on and the model in training mode.
An evaluation loop run between steps (under `torch.no_grad()`, or in eval
mode) is kept apart, and shown only for a step that trained nothing; with
gradient accumulation, each micro-batch starts the figures afresh, since the
previous one's backward freed its activations.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from gpuwatch.reports.training import MAX_NAME_CHARS, ModuleMemory, fit_name
from gpuwatch.torch.stats import StatsSource


class _Record(msgspec.Struct):
    forward_delta: int = 0
    forward_peak: int = 0
    backward_delta: int | None = None
    backward_peak: int | None = None


class _Frame(msgspec.Struct):
    name: str
    start: int
    high: int
    pending_ends: int = 0
    records: dict[str, _Record] | None = None
    """Where a forward's figures go: the training pass's, or the other passes'."""


class ModuleSampler:
    """Measures every module of `model` during the steps between `install()` and `remove()`."""

    def __init__(self, model: Any, source: StatsSource | None) -> None:
        self._names = module_names(model)
        self._source = source
        self._allocated: Callable[[], int] | None = None
        self._handles: list[Any] = []
        self._limits: tuple[int, int] | None = None
        """(the recursion limit found, the one set) while the hooks are on."""
        self._reset()

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def hook_count(self) -> int:
        return len(self._handles)

    def install(self) -> None:
        """Puts the forward hooks on; tensor hooks follow during the step."""
        if self._handles:
            return
        from torch.nn.modules import module  # here: importing gpuwatch.torch must not import torch

        # The allocator, once CUDA runs and if it sees every tensor; else the tensors' bytes.
        source = self._source
        uses_allocator = source is not None and source.tracks_tensors and source.ready()
        self._allocated = source.allocated_now if source is not None and uses_allocator else None
        self._grad_enabled = _grad_mode()

        # Two process-wide forward hooks, not two per module: a large model's thousands of
        # registrations would cost more than its step. Other models' modules are ignored.
        self._handles.append(module.register_module_forward_pre_hook(self._before_any))
        self._handles.append(module.register_module_forward_hook(self._after_any))
        found = sys.getrecursionlimit()
        self._limits = (found, _headroom(found))
        sys.setrecursionlimit(self._limits[1])

    def remove(self) -> list[ModuleMemory]:
        """Takes every hook off (tensor hooks included); returns what the step measured,
        the modules with the highest peak first."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._limits is not None and sys.getrecursionlimit() == self._limits[1]:
            sys.setrecursionlimit(self._limits[0])  # unless the program set one meanwhile
        self._limits = None
        for leaf in self._leaves:
            # An emptied hook dict stays attached to the parameter, and autograd calls into
            # Python for it at every backward: detach it, unless someone else hooked it since.
            if not leaf._backward_hooks:
                leaf._backward_hooks = None
        for frame in self._backward.values():
            if frame in self._open:  # a container's backward: it ends with the last gradient
                self._close_backward(frame, self._last_grad)
        records = self._training or self._other  # a step without training: its evaluation
        measured = [
            ModuleMemory(
                name,
                record.forward_delta,
                max(record.forward_peak, 0),
                record.backward_delta,
                None if record.backward_peak is None else max(record.backward_peak, 0),
            )
            for name, record in records.items()
        ]
        self._reset()
        return sorted(measured, key=lambda module: module.peak_bytes, reverse=True)

    def _reset(self) -> None:
        self._training: dict[str, _Record] = {}  # the last training pass: forward and backward
        self._other: dict[str, _Record] = {}  # the last pass without gradients (evaluation)
        self._other_roots: set[str] = set()
        self._current = self._training
        self._forwards_open = 0
        self._backward_seen = False
        self._open: list[_Frame] = []
        self._backward: dict[str, _Frame] = {}
        self._pending: dict[str, int] = {}
        self._hooked: dict[int, tuple[Any, list[tuple[bool, str]]]] = {}
        self._leaves: list[Any] = []  # parameters whose hook dict this sampler created
        self._seen: dict[int, Any] = {}  # storage address -> a weak reference to its tensor
        self._produced = 0
        self._last_grad = 0

    def _before_any(self, module: Any, args: Any) -> None:
        if (name := self._names.get(id(module))) is not None:
            self._before(name, module, args)

    def _after_any(self, module: Any, args: Any, output: Any) -> None:
        if (name := self._names.get(id(module))) is not None:
            self._after(name, module, args, output)

    def _before(self, name: str, module: Any, args: Any) -> None:
        if self._forwards_open == 0:
            self._start_pass(name, module)
        self._forwards_open += 1
        now = self._read()
        self._open.append(_Frame(name, now, now, records=self._current))
        if self._current is not self._training:
            return  # a pass without backward to follow, or whose backward is not the step's
        ends = [tensor for tensor in _tensors(args) if tensor.requires_grad]
        if not ends:  # the first layer: its backward ends with its parameters' gradients
            ends = [p for p in module.parameters(recurse=False) if p.requires_grad]
        for tensor in ends:
            self._on_grad(tensor, starts=False, name=name)
        self._pending[name] = self._pending.get(name, 0) + len(ends)

    def _after(self, name: str, module: Any, args: Any, output: Any) -> None:
        outputs = _tensors(output)
        self._count(outputs)
        now = self._read()
        frame = self._pop_frame(name)
        if frame is None or frame.records is None:
            return
        self._forwards_open = max(self._forwards_open - 1, 0)
        record = frame.records.setdefault(name, _Record())
        record.forward_delta += now - frame.start
        record.forward_peak = max(record.forward_peak, frame.high - frame.start)
        if frame.records is not self._training:
            return
        for tensor in outputs:
            if tensor.requires_grad:
                self._on_grad(tensor, starts=True, name=name)

    def _start_pass(self, name: str, module: Any) -> None:
        """Chooses where a forward that starts a pass records. The figures are the sampled step's
        training pass's (its last, with gradient accumulation): an evaluation loop run
        between steps (no gradients, or the model in eval mode) records apart, and counts
        only in a step that trains nothing."""
        if self._grad_enabled() and getattr(module, "training", True):
            if self._backward_seen:  # the next micro-batch: the previous one freed its memory
                self._start_training_pass()
            self._current = self._training
        else:
            if name in self._other_roots:  # the next batch of the evaluation
                self._other, self._other_roots = {}, set()
            self._other_roots.add(name)
            self._current = self._other

    def _start_training_pass(self) -> None:
        self._training = {}
        self._backward_seen = False
        self._open = [frame for frame in self._open if frame.records is not None]
        self._backward.clear()
        self._pending.clear()

    def _pop_frame(self, name: str) -> _Frame | None:
        """The innermost open forward frame of `name` (nearly always the last), taken off
        the stack."""
        if self._open and self._open[-1].name == name and self._open[-1].records is not None:
            return self._open.pop()
        frame = next(
            (f for f in reversed(self._open) if f.name == name and f.records is not None), None
        )
        if frame is not None:
            self._open.remove(frame)
        return frame

    def _on_grad(self, tensor: Any, *, starts: bool, name: str) -> None:
        """Calls back when `tensor`'s gradient is ready: one hook per tensor, however many
        modules wait on it (an output is the next module's input)."""
        known = self._hooked.get(id(tensor))
        if known is not None and known[0]() is tensor:
            known[1].append((starts, name))
            return
        waiting = [(starts, name)]
        self._hooked[id(tensor)] = (weakref.ref(tensor), waiting)
        if tensor.is_leaf and tensor._backward_hooks is None:
            self._leaves.append(tensor)
        self._handles.append(tensor.register_hook(partial(self._gradient_ready, waiting)))

    def _gradient_ready(self, waiting: list[tuple[bool, str]], grad: Any) -> None:
        self._backward_seen = True
        self._count([grad])
        self._last_grad = now = self._read()
        for starts, name in waiting:
            if starts:
                self._backward_starts(name, now)
            else:
                self._backward_part_ends(name, now)

    def _backward_starts(self, name: str, now: int) -> None:
        """The gradient of a module's output is ready."""
        if name not in self._backward:
            frame = _Frame(name, now, now, pending_ends=self._pending.get(name, 0))
            self._backward[name] = frame
            self._open.append(frame)

    def _backward_part_ends(self, name: str, now: int) -> None:
        """The gradient of one of a module's inputs (or first layer's parameters) is ready."""
        frame = self._backward.get(name)
        if frame is None:
            return
        frame.pending_ends -= 1
        if frame.pending_ends <= 0 and frame in self._open:
            self._close_backward(frame, now)

    def _close_backward(self, frame: _Frame, now: int) -> None:
        self._open.remove(frame)
        record = self._training.setdefault(frame.name, _Record())
        record.backward_delta = now - frame.start
        record.backward_peak = frame.high - frame.start

    def _count(self, tensors: list[Any]) -> None:
        """Adds the bytes of storages not counted yet: an in-place op's output, or a view,
        shares its input's storage. Memory freed and reused is counted anew."""
        if self._allocated is not None:
            return
        for tensor in tensors:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
                continue
            pointer = storage.data_ptr()
            known = self._seen.get(pointer)
            if known is None or known() is None:
                self._seen[pointer] = weakref.ref(tensor)
                self._produced += storage.nbytes()

    def _read(self) -> int:
        now = self._allocated() if self._allocated is not None else self._produced
        for frame in self._open:
            frame.high = max(frame.high, now)
        return now


_HOOK_FRAMES = 50
"""More than the deepest the hooks themselves call (into the probe, torch's `register_hook`)."""


def _headroom(limit: int) -> int:
    """The recursion limit under which a program that ran within `limit` frames unhooked
    runs hooked. Each module call it nests costs it at least three frames unhooked
    (`__call__`, `_call_impl`, `forward`), so it nests at most `limit // 3`, and each costs
    one frame more hooked; the hooks then call in at the deepest."""
    return limit + limit // 3 + _HOOK_FRAMES


_MAX_CLASS_CHARS = 60
_WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",  # torch.compile
}
"""Modules that wrap a model, and the attribute that holds it."""


def module_names(model: Any) -> dict[int, str]:
    """A name for each module of `model`, by `id()`: the model's class for the model, and
    `path (Class)` for the others (`layers.0 (Linear)`). A wrapper (DDP, DataParallel,
    torch.compile) is seen through: its model is named as the model, once, without the
    `module.` prefix, and the wrapper itself is not measured (its model is)."""
    while (inner := getattr(model, _WRAPPERS.get(type(model).__name__, ""), None)) is not None:
        model = inner
    return {
        id(module): _fit_with_class(path, type(module).__name__)
        for path, module in model.named_modules()
    }


def _fit_with_class(path: str, class_name: str) -> str:
    """`path (Class)` within a report's limit on names: a long path is cut, the class kept."""
    if not path:
        return fit_name(class_name)
    suffix = f" ({fit_name(class_name)[:_MAX_CLASS_CHARS]})"
    room = MAX_NAME_CHARS - len(suffix)
    printable = fit_name(path)
    return (printable if len(printable) <= room else printable[: room - 1] + "…") + suffix


def _tensors(value: Any) -> list[Any]:
    """The tensors in a module's arguments or output (nested tuples, lists and dicts)."""
    tensor_type = _tensor_type()
    if isinstance(value, tensor_type):  # the common cases first: a hook runs per module call
        return [value]
    if type(value) is tuple and len(value) == 1 and isinstance(value[0], tensor_type):
        return [value[0]]
    found: list[Any] = []
    _collect(value, tensor_type, found, 0)
    return found


def _collect(value: Any, tensor_type: type, found: list[Any], depth: int) -> None:
    if isinstance(value, tensor_type):
        found.append(value)
    elif depth < 3 and isinstance(value, tuple | list):
        for item in value:
            _collect(item, tensor_type, found, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            _collect(item, tensor_type, found, depth + 1)


def _grad_mode() -> Callable[[], bool]:
    import torch  # here: importing gpuwatch.torch must not import torch

    return torch.is_grad_enabled


@functools.cache
def _tensor_type() -> type:
    import torch  # here: importing gpuwatch.torch must not import torch

    return torch.Tensor
