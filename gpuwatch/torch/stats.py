"""Where the allocator's figures come from: the `StatsSource` interface and CUDA's allocator.

`CudaStatsSource` reads torch's caching allocator once per step through its raw
nested statistics (one call into C++, none of the flattening `memory_stats()`
does), and only once CUDA is initialised: it never starts CUDA itself, so a
watch set up before `gpuwatch.select()` or before the model moves to the GPU
changes nothing. Peaks are never reset unless asked: other tools read
`max_memory_allocated()` too. `SimulatedAllocator` (gpuwatch.torch.simulated)
implements the same interface without CUDA.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

OomObserver = Callable[[int, int], None]
"""Called on an out-of-memory error with (requested bytes, bytes free on the device)."""


class AllocatorStats(NamedTuple):
    """The caching allocator's counters at one moment (peaks since start or the last reset).

    A named tuple, not a dataclass: one is built every step, and a tuple builds in a
    fraction of the time."""

    allocated_bytes: int
    allocated_peak_bytes: int
    reserved_bytes: int
    reserved_peak_bytes: int
    active_bytes: int
    active_peak_bytes: int
    requested_bytes: int
    inactive_split_bytes: int
    """Free bytes inside segments that also hold live blocks: memory that is reserved but too
    fragmented to serve a request larger than its pieces."""
    alloc_retries: int
    """How often the allocator had to free its cache and try again: a sign of pressure."""
    ooms: int


class StatsSource(abc.ABC):
    """A device's allocator, as the watch reads it. Subclasses: CUDA's, and the simulator."""

    tensor_device_type: str = "cuda"
    """The `torch.device.type` of the tensors this allocator serves."""

    tracks_tensors: bool = True
    """True when `allocated_now()` follows every tensor of the device, so per-module figures
    come from it; otherwise they come from the tensors each module produces."""

    @property
    @abc.abstractmethod
    def device(self) -> str:
        """The device's name, as torch writes it (`cuda:0`)."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """True once the figures can be read without initialising CUDA."""

    @abc.abstractmethod
    def read(self) -> AllocatorStats:
        """Every counter, read at once. Only when `ready()`."""

    @abc.abstractmethod
    def allocated_now(self) -> int:
        """Bytes allocated to tensors now (one counter: for per-module hooks)."""

    @abc.abstractmethod
    def reset_peaks(self) -> None:
        """Sets every peak to the current value."""

    @abc.abstractmethod
    def attach_oom_observer(self, observer: OomObserver) -> None:
        """Calls `observer` on each out-of-memory error of this device. Only when `ready()`."""

    def detach_oom_observer(self, observer: OomObserver) -> None:
        """Stops calling `observer`; unknown observers are ignored."""
        return None

    def free_bytes(self) -> int | None:
        """Bytes free on the whole device, as CUDA sees it; `None` when unknown."""
        return None

    def total_bytes(self) -> int | None:
        """The whole device's memory; `None` when unknown."""
        return None

    def start_history(self) -> bool:
        """Starts recording allocation history for snapshots; False when it cannot."""
        return False

    def snapshot(self) -> dict[str, Any] | None:
        """A memory snapshot in the format pytorch.org/memory_viz reads; `None` without one."""
        return None

    def gpu_uuid(self) -> str | None:
        """The GPU's uuid (`GPU-...`), from CUDA_VISIBLE_DEVICES when it names GPUs by uuid."""
        return uuid_from_visible_devices(_index_of(self.device))


class CudaStatsSource(StatsSource):
    """torch's CUDA caching allocator for one device (the current one when `index` is None)."""

    def __init__(self, index: int | None = None) -> None:
        import torch  # here: importing gpuwatch.torch must not import torch

        self._torch: Any = torch  # typed loosely: torch's stubs lag behind its CUDA calls
        self._index = index

    @property
    def device(self) -> str:
        if self._index is None and self.ready():
            self._resolved()
        return "cuda" if self._index is None else f"cuda:{self._index}"

    def ready(self) -> bool:
        return bool(self._torch.cuda.is_initialized())

    def read(self) -> AllocatorStats:
        nested = self._torch.cuda.memory_stats_as_nested_dict(self._resolved())

        def of(name: str) -> tuple[int, int]:
            counter = nested.get(name, {}).get("all", {})
            return int(counter.get("current", 0)), int(counter.get("peak", 0))

        (allocated, allocated_peak), (reserved, reserved_peak) = (
            of("allocated_bytes"),
            of("reserved_bytes"),
        )
        active, active_peak = of("active_bytes")
        return AllocatorStats(
            allocated,
            allocated_peak,
            reserved,
            reserved_peak,
            active,
            active_peak,
            of("requested_bytes")[0],
            of("inactive_split_bytes")[0],
            int(nested.get("num_alloc_retries", 0)),
            int(nested.get("num_ooms", 0)),
        )

    def allocated_now(self) -> int:
        # The raw nested counters: memory_allocated() would flatten all of them per call.
        nested = self._torch.cuda.memory_stats_as_nested_dict(self._resolved())
        return int(nested.get("allocated_bytes", {}).get("all", {}).get("current", 0))

    def reset_peaks(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self._resolved())

    def attach_oom_observer(self, observer: OomObserver) -> None:
        _observers.add(self._resolved(), observer)

    def detach_oom_observer(self, observer: OomObserver) -> None:
        _observers.remove(observer)

    def free_bytes(self) -> int | None:
        free, _ = self._torch.cuda.mem_get_info(self._resolved())
        return int(free)

    def total_bytes(self) -> int | None:
        # The device's properties, read once by torch: no call into the driver.
        return int(self._torch.cuda.get_device_properties(self._resolved()).total_memory)

    def start_history(self) -> bool:
        self._torch.cuda.memory._record_memory_history(max_entries=100_000)
        return True

    def snapshot(self) -> dict[str, Any] | None:
        snapshot: dict[str, Any] = self._torch.cuda.memory._snapshot()
        return snapshot

    def gpu_uuid(self) -> str | None:
        try:
            uuid = str(self._torch.cuda.get_device_properties(self._resolved()).uuid)
        except (AttributeError, RuntimeError):
            return super().gpu_uuid()
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"

    def _resolved(self) -> int:
        """The device's index; the current device once CUDA runs, when none was given
        (asking before would start CUDA)."""
        if self._index is None and self.ready():
            self._index = int(self._torch.cuda.current_device())
        return self._index or 0


class _ObserverRegistry:
    """torch can attach an OOM observer but never detach one: one dispatcher per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_device: list[tuple[int, OomObserver]] = []
        self._attached = False

    def add(self, device: int, observer: OomObserver) -> None:
        with self._lock:
            self._by_device.append((device, observer))
            if not self._attached:
                import torch  # here: importing gpuwatch.torch must not import torch

                torch._C._cuda_attach_out_of_memory_observer(self._dispatch)  # type: ignore[attr-defined]
                self._attached = True

    def remove(self, observer: OomObserver) -> None:
        with self._lock:  # `!=`, not `is not`: each access to a bound method makes a new one
            self._by_device = [(d, o) for d, o in self._by_device if o != observer]

    def _dispatch(self, device: int, requested: int, allocated: int, free: int) -> None:
        with self._lock:
            chosen = [o for d, o in self._by_device if d == device]
        for observer in chosen:
            observer(int(requested), int(free))


_observers = _ObserverRegistry()


def uuid_from_visible_devices(index: int | None) -> str | None:
    """The uuid CUDA_VISIBLE_DEVICES gives CUDA device `index`, when it names GPUs by uuid
    (as `gpuwatch.select()` and `gpuwatch pick` set it by default)."""
    visible = [item.strip() for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if index is None or not 0 <= index < len(visible):
        return None
    chosen = visible[index]
    return chosen if chosen.startswith(("GPU-", "MIG-")) else None


def _index_of(device: str) -> int | None:
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else None
