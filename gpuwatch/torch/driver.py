"""This process's GPU memory as the driver counts it: the CUDA context and every library
included, which torch's allocator does not see.

Read through gpuwatch's own backends (the daemon when one answers, else NVML),
from the publishing thread only, every few seconds. A driver that cannot be
read, or a process in another PID namespace than the driver's view, gives
`None`: the figure is left out, never guessed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpuwatch.backends import open_backend
from gpuwatch.backends.base import Backend
from gpuwatch.errors import GpuwatchError


class ProcessMemory:
    """Callable: bytes this process holds on the GPU `uuid_of()` names (all its GPUs if None)."""

    def __init__(self, uuid_of: Callable[[], str | None], pid: int | None = None) -> None:
        self._uuid_of = uuid_of
        self._pid = pid or os.getpid()
        self._backend: Backend | None = None
        self._broken = False

    def __call__(self) -> int | None:
        if self._broken:
            return None
        try:
            if self._backend is None:
                self._backend = open_backend()
            snapshot = self._backend.sample()
        except GpuwatchError:
            self._broken = True  # no driver here: stop asking
            return None
        uuid = self._uuid_of()
        used = [
            process.memory_used_bytes
            for process in snapshot.processes
            if process.pid == self._pid
            and process.memory_used_bytes is not None
            and (uuid is None or uuid in (process.gpu_uuid, process.mig_uuid))
        ]
        return sum(used) if used else None

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None
