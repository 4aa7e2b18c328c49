"""`watch()`: live GPU memory of a training loop, per step, per module, and at an OOM.

Per step the watch reads the allocator's counters once (a few microseconds)
and hands them to a background sender; nothing else happens in the training
thread. With `per_module=True`, hooks go on for one step in `every` and come
off after it. The first step that finds CUDA initialised attaches torch's OOM
observer and, when asked, starts history recording: the watch never
initialises CUDA itself.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

from gpuwatch.errors import InvalidValueError
from gpuwatch.reports.oom import OomReport
from gpuwatch.reports.training import (
    MAX_MODULES,
    MemoryPoint,
    ModuleMemory,
    TrainingReport,
    this_hostname,
)
from gpuwatch.torch.driver import ProcessMemory
from gpuwatch.torch.modules import ModuleSampler
from gpuwatch.torch.oom_writer import (
    check_report_dir,
    largest_tensors,
    requested_from_message,
    write_oom,
)
from gpuwatch.torch.publish import Sender, StepQueue, StepRecord
from gpuwatch.torch.simulated import SimulatedOutOfMemory
from gpuwatch.torch.stats import CudaStatsSource, StatsSource

_noticed: set[str] = set()


class Watch:
    """A running watch of a training loop's GPU memory (`gpuwatch.torch.watch()` starts one).
    Use it as a context manager, or call `close()`.

    Without an optimizer, call `step()` once per training step. With one, steps
    are counted from the optimizer's step hook, and `step()` counts a step only
    when the optimizer did not step since the previous `step()` (a step AMP's
    scaler skipped), so calling both never counts twice.

    >>> import torch
    >>> model = torch.nn.Linear(4, 2)
    >>> with watch(model, per_module=True, publish=False) as memory:  # doctest: +SKIP
    ...     for _ in range(3):
    ...         model(torch.randn(8, 4)).sum().backward()
    ...         memory.step()
    """

    def __init__(
        self,
        model: Any = None,
        *,
        optimizer: Any = None,
        every: int = 1,
        per_module: bool = False,
        oom_dir: str | os.PathLike[str] | None = None,
        record_history: bool = False,
        reset_peaks: bool = False,
        source: StatsSource | None = None,
        publish: bool = True,
        lease_dir: str | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidValueError(f"every={every!r}: give a whole number of steps, 1 or more")
        self.model = model
        self.every = every
        self.reset_peaks = reset_peaks
        self.record_history = record_history
        # Whole now: the script may change directory before an OOM, and the report's
        # paths must still open from wherever it is read.
        self.oom_dir = os.path.abspath(oom_dir) if oom_dir is not None else os.getcwd()
        check_report_dir(self.oom_dir)
        self.notice: str | None = None
        self.source = source if source is not None else self._default_source()
        self.steps = 0
        self.oom_report_path: str | None = None
        self.last_modules: tuple[ModuleMemory, ...] = ()
        self.modules_step: int | None = None
        self._ready = False
        self._handled_oom = False
        self._closed = False
        self._optimizer_stepped = False
        self._last_tick = time.perf_counter()
        self._last_step_time_s = 0.0
        self._queue = StepQueue()
        self._driver: Any = None  # this process's memory as the driver counts it, when on CUDA
        self._last_driver_bytes: int | None = None
        self._sampler = (
            ModuleSampler(model, self.source) if per_module and model is not None else None
        )
        self._hook = (
            optimizer.register_step_post_hook(self._on_optimizer_step) if optimizer else None
        )
        self._sender = self._start_sender(lease_dir) if publish else None
        self._check_ready()
        if self._sampler is not None:
            self._sampler.install()

    @property
    def dropped(self) -> int:
        """Step records dropped because the sender fell behind."""
        return self._queue.dropped

    @property
    def report_path(self) -> str | None:
        """The file this watch publishes to, once it has published."""
        return self._sender.path if self._sender is not None else None

    @property
    def hooks_installed(self) -> int:
        """Hooks this watch has on the model and its tensors now (0 between sampled steps)."""
        return self._sampler.hook_count if self._sampler is not None else 0

    def step(self) -> None:
        """Ends a training step (see the class docstring about optimizers)."""
        if self._closed:
            return
        if self._hook is not None and self._optimizer_stepped:
            self._optimizer_stepped = False
            return
        self._tick()

    def publish_now(self) -> None:
        """Publishes the latest step at once, without waiting for the sender's next turn."""
        if self._sender is not None:
            self._sender.flush()

    def close(self) -> None:
        """Takes every hook off, stops publishing and removes the report. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._hook is not None:
            self._hook.remove()
        if self._sampler is not None:
            self._sampler.remove()
        if self.source is not None and self._ready:
            self.source.detach_oom_observer(self._on_oom)
        if self._sender is not None:
            self._sender.close()
        if self._driver is not None:
            self._driver.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not self._handled_oom and _is_oom(exc):
                self._on_oom(getattr(exc, "requested_bytes", None) or _requested(exc), None)
        finally:
            self.close()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._tick()
        self._optimizer_stepped = True

    def _tick(self) -> None:
        now = time.perf_counter()
        step_time_s, self._last_tick = now - self._last_tick, now
        self._last_step_time_s = step_time_s
        self.steps += 1
        self._handled_oom = False  # a program that caught the last OOM may meet another
        stats = None
        if self.source is not None and (self._ready or self._check_ready()):
            stats = self.source.read()
            if self.reset_peaks:
                self.source.reset_peaks()
        if self._sampler is not None:
            self._sample_modules()
        self._queue.put(StepRecord(self.steps, step_time_s, stats))

    def _sample_modules(self) -> None:
        assert self._sampler is not None
        if self._sampler.installed:
            self.last_modules = tuple(self._sampler.remove()[:MAX_MODULES])
            self.modules_step = self.steps
        if self.steps % self.every == 0:
            self._sampler.install()

    def _check_ready(self) -> bool:
        """Once CUDA runs: attach the OOM observer, start history if asked."""
        if self._ready or self.source is None or not self.source.ready():
            return self._ready
        self._ready = True
        self.source.attach_oom_observer(self._on_oom)
        if self.record_history and not self.source.start_history():
            _notice("gpuwatch.torch: this allocator records no history: no snapshot at an OOM")
        return True

    def _on_oom(self, requested_bytes: int | None, free_bytes: int | None) -> None:
        if self._handled_oom:
            return
        self._handled_oom = True
        try:
            self.oom_report_path = write_oom(
                self._oom_facts(requested_bytes, free_bytes),
                self.oom_dir,
                self.source.snapshot() if self.source and self.record_history else None,
            )
            # Published at once, so that a reader sees the OOM before the step ends, if ever.
            self._queue.put(StepRecord(self.steps, self._last_step_time_s, self._read_stats()))
        except Exception as error:  # inside the allocator: never add a second failure
            sys.stderr.write(f"gpuwatch.torch: could not write the OOM report: {error}\n")

    def _oom_facts(self, requested_bytes: int | None, free_bytes: int | None) -> OomReport:
        stats = self._read_stats()
        rank, world_size = rank_and_world_size()
        if free_bytes is None and self.source is not None and self._ready:
            free_bytes = self.source.free_bytes()
        return OomReport(
            pid=os.getpid(),
            rank=rank,
            world_size=world_size,
            hostname=this_hostname(),
            device=self._device_name(),
            at=time.time(),
            step=self.steps,
            requested_bytes=requested_bytes,
            device_free_bytes=free_bytes,
            device_total_bytes=self.source.total_bytes() if self.source and self._ready else None,
            allocated_bytes=stats.allocated_bytes if stats else None,
            allocated_peak_bytes=stats.allocated_peak_bytes if stats else None,
            reserved_bytes=stats.reserved_bytes if stats else None,
            inactive_split_bytes=stats.inactive_split_bytes if stats else None,
            alloc_retries=stats.alloc_retries if stats else None,
            nvml_process_bytes=self._last_driver_bytes,
            gpu_uuid=self._gpu_uuid(),
            model_training=bool(self.model.training) if self.model is not None else None,
            grad_enabled=_grad_enabled(),
            modules=self.last_modules,
            tensors=largest_tensors(self.source.tensor_device_type if self.source else "cpu"),
        )

    def _read_stats(self) -> Any:
        if self.source is None or not self._ready:
            return None
        return self.source.read()

    def _build_report(
        self, latest: StepRecord, recent: tuple[MemoryPoint, ...], driver_bytes: int | None
    ) -> TrainingReport:
        """Runs in the sender's thread."""
        self._last_driver_bytes = driver_bytes
        rank, world_size = rank_and_world_size()
        stats = latest.stats
        figures = {} if stats is None else _memory_fields(stats)
        return TrainingReport(
            pid=os.getpid(),
            rank=rank,
            world_size=world_size,
            hostname=this_hostname(),
            device=self._device_name(),
            step=latest.step,
            published_at=time.time(),
            gpu_uuid=self._gpu_uuid(),
            step_time_s=latest.step_time_s,
            nvml_process_bytes=driver_bytes,
            modules=self.last_modules,
            modules_step=self.modules_step,
            recent=recent,
            dropped_reports=self._queue.dropped,
            notice=self.notice,
            oom_report=self.oom_report_path,
            **figures,
        )

    def _start_sender(self, lease_dir: str | None) -> Sender:
        uses_cuda = isinstance(self.source, CudaStatsSource)
        self._driver = ProcessMemory(self._gpu_uuid) if uses_cuda else None
        sender = Sender(
            self._queue,
            self._build_report,
            process_memory=self._driver_bytes if uses_cuda else None,
            lease_dir=lease_dir,
        )
        sender.start()
        return sender

    def _driver_bytes(self) -> int | None:
        return self._driver() if self._driver is not None and self._ready else None

    def _device_name(self) -> str:
        if self.source is None:
            return "cpu"
        return self.source.device if self._ready else f"{self.source.device} (not started yet)"

    def _gpu_uuid(self) -> str | None:
        return self.source.gpu_uuid() if self.source is not None and self._ready else None

    def _default_source(self) -> StatsSource | None:
        try:
            import torch  # here: importing gpuwatch.torch must not import torch
        except ImportError:
            self.notice = "torch is not installed: step times only"
            _notice(f"gpuwatch.torch: {self.notice}")
            return None
        if torch.version.cuda is None:
            self.notice = (
                "this torch has no CUDA (a CPU build): no allocator figures; "
                "per-module memory comes from the tensors modules produce"
            )
            _notice(f"gpuwatch.torch: {self.notice}")
            return None
        return CudaStatsSource(_cuda_index_of(self.model))


def rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the world's size: from torch.distributed once it runs,
    else from the variables torchrun sets, else (0, 1)."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1
    return (rank, world) if 0 <= rank < world else (0, 1)


def _memory_fields(stats: Any) -> dict[str, Any]:
    return dict(stats._asdict())


def _cuda_index_of(model: Any) -> int | None:
    """The CUDA device of the model's first parameter, read without touching CUDA."""
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        return None
    for parameter in parameters():
        if parameter.device.type == "cuda":
            return int(parameter.device.index or 0)
        break
    return None


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, SimulatedOutOfMemory):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None)
    return oom_type is not None and isinstance(error, oom_type)


def _requested(error: BaseException) -> int | None:
    return requested_from_message(str(error))


def _grad_enabled() -> bool | None:
    torch = sys.modules.get("torch")
    return bool(torch.is_grad_enabled()) if torch is not None else None


def _notice(text: str) -> None:
    """Says `text` on stderr once per process."""
    if text not in _noticed:
        _noticed.add(text)
        sys.stderr.write(text + "\n")


watch = Watch
"""`gpuwatch.torch.watch(model, ...)`: starts watching a training loop (a `Watch`); see
docs/guide/training.md."""
