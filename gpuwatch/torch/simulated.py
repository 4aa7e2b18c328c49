"""A simulated caching allocator: the `StatsSource` for tests, benchmarks and demos without CUDA.

It keeps the books the way CUDA's caching allocator does, in miniature:
requests are rounded up to 512 bytes; requests up to 1 MiB share 2 MiB
segments, those up to 10 MiB share 20 MiB segments, larger ones get segments
rounded up to 2 MiB; freed blocks stay
reserved (cached) for reuse; free space inside a segment that still holds live
blocks counts as `inactive_split_bytes`. When a request does not fit in
`capacity_bytes`, the cache is released and the request retried (a retry); if
it still does not fit, the OOM observers are called and `SimulatedOutOfMemory`
is raised, as torch raises `torch.OutOfMemoryError`.

    >>> sim = SimulatedAllocator(capacity_bytes=8 << 20)
    >>> block = sim.allocate(1000)
    >>> sim.read().allocated_bytes, sim.read().reserved_bytes
    (1024, 2097152)
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from gpuwatch.torch.stats import AllocatorStats, OomObserver, StatsSource

ROUND_BYTES = 512
SMALL_LIMIT_BYTES = 1 << 20
SEGMENT_BYTES = 2 << 20
LARGE_SEGMENT_BYTES = 20 << 20
LARGE_LIMIT_BYTES = 10 << 20


class SimulatedOutOfMemory(RuntimeError):
    """A request the simulated device could not serve (torch raises `torch.OutOfMemoryError`)."""

    def __init__(self, requested_bytes: int, free_bytes: int) -> None:
        super().__init__(
            f"simulated out of memory: tried to allocate {requested_bytes} bytes "
            f"with {free_bytes} bytes free"
        )
        self.requested_bytes = requested_bytes


class _Segment(msgspec.Struct):
    size: int
    small: bool
    address: int
    blocks: dict[int, tuple[int, int]] = msgspec.field(
        default_factory=dict
    )  # id -> (size, requested)
    used: int = 0

    @property
    def split_bytes(self) -> int:
        """Free bytes of a segment that also holds live blocks (none when it holds none)."""
        return self.size - self.used if self.blocks else 0


class SimulatedAllocator(StatsSource):
    """A device of `capacity_bytes`, named `device`, that the caller allocates on by hand."""

    tracks_tensors = False  # it does not see torch's tensors: modules are measured by theirs
    tensor_device_type = "cpu"  # the largest tensors at an OOM are looked for on the CPU

    def __init__(
        self, capacity_bytes: int = 16 << 30, *, device: str = "cuda:0", ready: bool = True
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.is_ready = ready
        self._device = device
        self._segments: list[_Segment] = []
        self._ids = itertools.count(1)
        self._observers: list[OomObserver] = []
        self._peaks = {"allocated": 0, "reserved": 0}
        # Kept up to date at each change, as CUDA's allocator does: read() only copies them.
        self._allocated = self._requested = self._reserved_bytes = self._split = 0
        self.alloc_retries = 0
        self.ooms = 0

    @property
    def device(self) -> str:
        return self._device

    def ready(self) -> bool:
        return self.is_ready

    def allocate(self, nbytes: int) -> int:
        """Allocates `nbytes`; returns the block's id for `free()`."""
        size = -(-max(nbytes, 1) // ROUND_BYTES) * ROUND_BYTES
        small = size <= SMALL_LIMIT_BYTES
        segment = self._fitting(size, small) or self._grow(size, small, nbytes)
        block = next(self._ids)
        self._change(segment, block, (size, nbytes))
        self._note_peaks()
        return block

    def free(self, block: int) -> None:
        """Frees a block; its segment stays reserved, as in CUDA's cache."""
        for segment in self._segments:
            if block in segment.blocks:
                self._change(segment, block, None)
                return
        raise KeyError(f"no block {block}")

    def empty_cache(self) -> None:
        """Releases segments that hold no live block (`torch.cuda.empty_cache()`)."""
        self._segments = [segment for segment in self._segments if segment.blocks]
        self._reserved_bytes = sum(segment.size for segment in self._segments)

    def read(self) -> AllocatorStats:
        allocated, peaks = self._allocated, self._peaks
        return AllocatorStats(
            allocated,
            peaks["allocated"],
            self._reserved_bytes,
            peaks["reserved"],
            allocated,  # nothing waits on a stream here: active is allocated
            peaks["allocated"],
            self._requested,
            self._split,
            self.alloc_retries,
            self.ooms,
        )

    def allocated_now(self) -> int:
        return self._allocated

    def reset_peaks(self) -> None:
        self._peaks = {"allocated": self._allocated, "reserved": self._reserved_bytes}

    def attach_oom_observer(self, observer: OomObserver) -> None:
        self._observers.append(observer)

    def detach_oom_observer(self, observer: OomObserver) -> None:
        self._observers = [known for known in self._observers if known != observer]

    @property
    def observers(self) -> tuple[OomObserver, ...]:
        return tuple(self._observers)

    def free_bytes(self) -> int:
        return self.capacity_bytes - self._reserved()

    def total_bytes(self) -> int:
        return self.capacity_bytes

    def start_history(self) -> bool:
        return True

    def snapshot(self) -> dict[str, Any]:
        """The segments and blocks in memory_viz's snapshot format (no traces)."""
        return {
            "segments": [_segment_record(segment, self._device) for segment in self._segments],
            "device_traces": [[]],
        }

    def _fitting(self, size: int, small: bool) -> _Segment | None:
        for segment in self._segments:
            if segment.small == small and segment.size - segment.used >= size:
                return segment
        return None

    def _grow(self, size: int, small: bool, requested: int) -> _Segment:
        if small:
            segment_size = SEGMENT_BYTES
        elif size < LARGE_LIMIT_BYTES:
            segment_size = LARGE_SEGMENT_BYTES
        else:
            segment_size = -(-size // SEGMENT_BYTES) * SEGMENT_BYTES
        if self._reserved() + segment_size > self.capacity_bytes:
            self.alloc_retries += 1  # CUDA frees its cache and tries once more
            self.empty_cache()
            if self._reserved() + segment_size > self.capacity_bytes:
                self.ooms += 1
                free = self.free_bytes()
                for observer in list(self._observers):
                    observer(requested, free)
                raise SimulatedOutOfMemory(requested, free)
        address = max((s.address + s.size for s in self._segments), default=0x7F0000000000)
        segment = _Segment(segment_size, small, address)
        self._segments.append(segment)
        self._reserved_bytes += segment_size
        return segment

    def _change(self, segment: _Segment, block: int, value: tuple[int, int] | None) -> None:
        """Adds (`value`) or removes (`None`) a block, keeping the counters right."""
        self._split -= segment.split_bytes
        size, requested = value if value is not None else segment.blocks.pop(block)
        sign = 1 if value is not None else -1
        if value is not None:
            segment.blocks[block] = value
        segment.used += sign * size
        self._allocated += sign * size
        self._requested += sign * requested
        self._split += segment.split_bytes

    def _reserved(self) -> int:
        return self._reserved_bytes

    def _note_peaks(self) -> None:
        self._peaks["allocated"] = max(self._peaks["allocated"], self._allocated)
        self._peaks["reserved"] = max(self._peaks["reserved"], self._reserved_bytes)


def _segment_record(segment: _Segment, device: str) -> dict[str, Any]:
    offset = segment.address
    blocks = []
    for size, requested in segment.blocks.values():
        blocks.append(
            {
                "address": offset,
                "size": size,
                "requested_size": requested,
                "state": "active_allocated",
                "frames": [],
            }
        )
        offset += size
    if segment.size > segment.used:
        blocks.append({"address": offset, "size": segment.size - segment.used, "state": "inactive"})
    return {
        "device": int(index) if (index := device.rpartition(":")[2]).isdigit() else 0,
        "address": segment.address,
        "total_size": segment.size,
        "allocated_size": segment.used,
        "active_size": segment.used,
        "requested_size": sum(r for _, r in segment.blocks.values()),
        "stream": 0,
        "segment_type": "small" if segment.small else "large",
        "blocks": blocks,
    }
