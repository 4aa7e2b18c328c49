"""An out-of-memory report: what was asked, what was free, where the memory went, what to do.

`gpuwatch.torch.watch()` writes one as JSON (and as text, rendered by
`render()`) when CUDA runs out of memory; `gpuwatch torch-report FILE` renders
it again. The reader checks every field, as for training reports: the file may
come from anywhere. No torch here.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import msgspec

from gpuwatch.paths import read_regular_file
from gpuwatch.record_fields import (
    BadRecord,
    bool_field,
    bytes_field,
    int_field,
    list_field,
    optional,
    text_field,
    time_field,
)
from gpuwatch.reports.training import (
    ModuleMemory,
    RankMemory,
    module_from_dict,
    rank_fields,
    rank_memory_fields,
)
from gpuwatch.units import format_size

FORMAT = "gpuwatch-oom/1"
MAX_ITEMS = 20
MAX_REPORT_BYTES = 1 << 20
TEXT_START = "Out of memory on "
"""How the text copy of a report (`render()`) begins."""


class TensorSize(msgspec.Struct, frozen=True):
    """One live tensor at the time of the error."""

    shape: str
    dtype: str
    nbytes: int


class OomReport(RankMemory, msgspec.Struct, frozen=True):
    """The facts at an out-of-memory error. Allocator figures are `None` when unknown."""

    at: float
    step: int
    device_free_bytes: int | None = None
    device_total_bytes: int | None = None
    model_training: bool | None = None
    grad_enabled: bool | None = None
    modules: tuple[ModuleMemory, ...] = ()
    tensors: tuple[TensorSize, ...] = ()
    snapshot_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        fields: dict[str, Any] = msgspec.to_builtins(self)
        return {"format": FORMAT, **fields}


def report_from_dict(data: object) -> OomReport:
    """An OOM report from decoded JSON, every field checked; raises `BadRecord`."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadRecord("not a gpuwatch OOM report")
    return OomReport(
        *rank_fields(data),
        **rank_memory_fields(data),
        at=time_field(data, "at"),
        step=int_field(data, "step"),
        device_free_bytes=optional(data, "device_free_bytes", bytes_field),
        device_total_bytes=optional(data, "device_total_bytes", bytes_field),
        model_training=optional(data, "model_training", bool_field),
        grad_enabled=optional(data, "grad_enabled", bool_field),
        modules=tuple(module_from_dict(item) for item in list_field(data, "modules", MAX_ITEMS)),
        tensors=tuple(_tensor(item) for item in list_field(data, "tensors", MAX_ITEMS)),
        snapshot_path=optional(data, "snapshot_path", _path),
    )


def read_report(path: str) -> OomReport:
    """Reads and checks an OOM report file; raises `BadRecord`, or `UnreadableFileError`
    where it is no regular file of at most `MAX_REPORT_BYTES` that can be read."""
    raw = read_regular_file(path, MAX_REPORT_BYTES)
    try:
        return report_from_dict(json.loads(raw))
    except (ValueError, RecursionError) as error:
        if isinstance(error, BadRecord):
            raise
        raise BadRecord("not JSON") from error


def read_text(raw: bytes) -> str:
    """The text copy of a report, as read from a file: anything unprintable (a terminal's
    escape sequences) is shown as `?`."""
    text = raw.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() or c == "\n" else "?" for c in text)


TEXT_WIDTH = 80
"""The text report's lines are at most this wide (a terminal's default), but for long words."""


def render(report: OomReport) -> str:
    """The report for people: the facts, then the fixes that apply."""
    fixes = [
        line
        for fix in advice(report)
        for line in textwrap.wrap(
            fix,
            TEXT_WIDTH,
            initial_indent="  - ",
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    ]
    return "\n".join([*_facts(report), "", "What to do:", *fixes])


def advice(report: OomReport) -> list[str]:
    """The fixes that apply to this error, the likeliest first: to what holds the memory.

    Where the modules' own figures (their activations) explain little of what is allocated,
    the rest is in tensors kept alive outside them, and advice on activations (a smaller
    batch, checkpointing) would blame the wrong thing: it is left out."""
    fixes = []
    if _fragmented(report):
        fixes.append(
            "fragmentation: the cache holds enough free memory, but in pieces smaller than the "
            "request; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting"
        )
    if _others_hold_the_gpu(report):
        fixes.append(_OTHERS)
    if report.model_training is False and report.grad_enabled:
        fixes.append(
            "the model is in eval mode but gradients are on: wrap evaluation in "
            "torch.no_grad() (or torch.inference_mode()) so activations are not kept"
        )
    if (kept := _kept_alive_bytes(report)) is not None:
        fixes += _kept_alive_fixes(report, kept)
    else:
        fixes += _activation_fixes(report)
    fixes.append(
        "torch.cuda.empty_cache() does not help: before raising, the allocator already "
        "released its unused cache and retried; empty_cache only hands cached memory to "
        "other processes"
    )
    return fixes


_OTHERS = (
    "other processes hold most of this GPU: `gpuwatch status` shows which; a GPU with room "
    "is `gpuwatch pick --min-free SIZE`"
)
EXPLAINS_LITTLE = 0.25
"""The share of the memory allocated to tensors below which the modules' figures (their
activations at the last sampled step) explain little of it."""


def _activation_fixes(report: OomReport) -> list[str]:
    fixes = ["a smaller batch: activation memory grows with the batch size"]
    if report.modules:
        names = ", ".join(module.name for module in report.modules[:3])
        fixes.append(
            f"activation checkpointing (torch.utils.checkpoint) on the largest modules "
            f"({names}): recomputes their activations in backward instead of keeping them"
        )
    if report.grad_enabled is not False and report.model_training is not False:
        fixes.append("in evaluation loops, torch.no_grad() keeps no activations for backward")
    return fixes


def _kept_alive_fixes(report: OomReport, kept_bytes: int) -> list[str]:
    """What to do where tensors outside the modules' activations hold most of the memory:
    the largest live tensors name them, or, where even they hold little of it, tensors no
    Python object holds: an autograd graph kept alive, which keeps what its steps saved."""
    held = f"tensors kept alive outside the modules hold {format_size(kept_bytes)}"
    seen = sum(tensor.nbytes for tensor in report.tensors)
    if report.tensors and seen >= kept_bytes * EXPLAINS_LITTLE:
        first = (
            f"{held}; the largest live tensors above hold {format_size(seen)} of it: keep none "
            "of them from one step to the next that you do not need (outputs, caches, lists "
            "of them), or move what must stay to the CPU"
        )
    else:
        first = (
            f"{held}, but the live tensors Python can see hold only {format_size(seen)} of it: "
            "the rest is most likely held by an autograd graph kept alive, as a running total "
            "of losses kept as tensors keeps every step's graph (add loss.item(), not loss; "
            ".detach() what is kept for later)"
        )
    return [
        first,
        "if what is kept is the model's own weights, gradients and optimizer state: lower "
        "precision (bf16), an optimizer with less state, or sharding (FSDP, DeepSpeed ZeRO)",
    ]


def _modules_peak_bytes(report: OomReport) -> int | None:
    """The most any module added at the last sampled step: its activations' peak (modules
    nest, so the outermost's covers the rest)."""
    return max((module.peak_bytes for module in report.modules), default=None)


def _kept_alive_bytes(report: OomReport) -> int | None:
    """What tensors outside the modules' activations hold, where the modules explain little
    of what is allocated; `None` where they explain enough, or nothing says."""
    peak, allocated = _modules_peak_bytes(report), report.allocated_bytes
    if peak is None or not allocated or peak >= allocated * EXPLAINS_LITTLE:
        return None
    return allocated - peak


def _where_it_is(report: OomReport) -> list[str]:
    """`Where the memory is:` what the modules explain, what the rest is, and where."""
    allocated, reserved = report.allocated_bytes, report.reserved_bytes
    peak = _modules_peak_bytes(report)
    rows: list[tuple[str, int]] = []
    if peak is not None and allocated is not None:
        top = max(report.modules, key=lambda module: module.peak_bytes).name
        rows.append((f"the modules' activations ({top}, at its peak)", peak))
        rows.append(("other tensors kept alive", max(0, allocated - peak)))
    if allocated is not None and reserved is not None:
        rows.append(("the allocator's cache, held for reuse", max(0, reserved - allocated)))
    driver, others = report.nvml_process_bytes, _others_bytes(report)
    if driver is not None and reserved is not None:
        rows.append(
            ("this process outside torch (CUDA context, libraries)", max(0, driver - reserved))
        )
    if others is not None:
        rows.append(("other processes on the GPU", others))
    if not rows:
        return []
    return ["", "Where the memory is:", *(f"  {what:<54} {_size(size):>10}" for what, size in rows)]


def _others_bytes(report: OomReport) -> int | None:
    """What other processes hold of the GPU: all that is in use, less this process's
    (the driver's count for it, else what torch reserved); `None` where unknown."""
    total, free = report.device_total_bytes, report.device_free_bytes
    mine = report.nvml_process_bytes or report.reserved_bytes
    if total is None or free is None or mine is None:
        return None
    return max(0, total - free - mine)


def _facts(report: OomReport) -> list[str]:
    where = f"{report.device}" + (f" ({report.gpu_uuid})" if report.gpu_uuid else "")
    lines = [
        f"Out of memory on {where}, rank {report.rank} of {report.world_size}, "
        f"pid {report.pid} on {report.hostname}, at step {report.step}",
        f"  requested            {_size(report.requested_bytes)}",
        f"  free on the device   {_size(report.device_free_bytes)}",
        f"  reserved by torch    {_size(report.reserved_bytes)}",
        f"  allocated to tensors {_size(report.allocated_bytes)}"
        f" (peak {_size(report.allocated_peak_bytes)})",
        f"  fragmented (cached, in split segments) {_size(report.inactive_split_bytes)}",
        f"  allocator retries    {'-' if report.alloc_retries is None else report.alloc_retries}",
    ]
    if report.nvml_process_bytes is not None:
        lines.append(
            f"  driver's count for this process {_size(report.nvml_process_bytes)} "
            "(beyond reserved: the CUDA context and other libraries)"
        )
    if report.modules:
        lines += ["", "Largest modules (last sampled step: forward peak / backward peak):"]
        lines += [
            f"  {m.name:<40} {_size(m.forward_peak_bytes):>10} / {_size(m.backward_peak_bytes)}"
            for m in report.modules[:10]
        ]
    lines += _where_it_is(report)
    if report.tensors:
        lines += ["", "Largest live tensors:"]
        lines += [f"  {_size(t.nbytes):>10}  {t.dtype} {t.shape}" for t in report.tensors[:10]]
    if report.snapshot_path:
        lines += [
            "",
            f"Memory snapshot: {report.snapshot_path} (open it at pytorch.org/memory_viz)",
        ]
    return lines


def _fragmented(report: OomReport) -> bool:
    split, requested = report.inactive_split_bytes, report.requested_bytes
    return bool(split and requested and split >= requested)


def _others_hold_the_gpu(report: OomReport) -> bool:
    """Whether other processes, not this one, keep the request from fitting: they hold more
    of the GPU than this process does, or (the GPU's size unknown) this process holds less
    than it asked for and the GPU has less free."""
    others, reserved = _others_bytes(report), report.reserved_bytes
    if others is not None and reserved is not None:
        return others > reserved
    free, requested = report.device_free_bytes, report.requested_bytes
    if free is None or reserved is None or requested is None:
        return False
    return free < requested and reserved < requested


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _tensor(item: object) -> TensorSize:
    if not isinstance(item, dict):
        raise BadRecord("tensors: not an object")
    return TensorSize(
        text_field(item, "shape"), text_field(item, "dtype"), bytes_field(item, "nbytes")
    )


def _path(data: dict[str, Any], name: str) -> str:
    return text_field(data, name, 4096)
