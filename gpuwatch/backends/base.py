"""The one way gpuwatch reads GPUs: the `Backend` interface every backend implements."""

from __future__ import annotations

import abc
import enum

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.models import Snapshot


class SampleScope(enum.Enum):
    """How much of each GPU a sample reads.

    Reading less means fewer driver calls: choosing GPUs needs only who they
    are, how busy they are and which processes run on them.
    """

    FULL = "full"
    """Every metric, the driver versions and the process list."""

    SELECTION = "selection"
    """Identity (`uuid`, `name`, `minor_number`: what tells which job of a scheduler holds
    it), memory, utilization and the driver's process lists, without the host's details of
    each process (`user`, `command`, ...). Other fields are `None`."""


class Backend(abc.ABC):
    """A source of `Snapshot`s. Construct one, call `sample()` as often as needed, `close()` it.

    Opening raises `DriverNotFoundError`, `NoGpuError` or `ScenarioError` when
    there is nothing to read. After that, `sample()` does not raise for a
    faulty GPU: the fault is reported in that GPU's `GpuSample.error`.
    Backends are used from one thread at a time.
    """

    name: str
    """Short name shown to users: `nvml`, `sim`, ..."""

    simulation: str | None = None
    """The simulated node this backend reads, named for its own lease directory
    (`gpuwatch.paths.sim_lease_dir`); `None` for real GPUs. Its snapshots say `simulated`."""

    @abc.abstractmethod
    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        """Read every GPU now; fields outside `scope` are `None`."""

    def recent_utilization_pct(self, window_s: float) -> dict[str, float]:
        """Each GPU's highest utilization over the last `window_s` seconds, by UUID, where
        this backend keeps a history (the daemon's); empty where it keeps none or cannot tell."""
        return {}

    def history(self, window_s: float) -> list[GpuSeries] | None:
        """Each GPU's samples over the last `window_s` seconds, where this backend keeps a
        history (the daemon's); `None` where it keeps none. Raises `OSError`, `ValueError`
        or `DaemonUnavailableError` where it keeps one but cannot answer now."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release the driver or other resources. Safe to call twice."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
