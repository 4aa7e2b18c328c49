"""What every fleet source is: `read()` gives the fleet now as a `FleetState`."""

from __future__ import annotations

from typing import Protocol

from gpuwatch.fleet_model import FleetState


class FleetSource(Protocol):
    """Reads a fleet. One `read()` costs a fixed, small number of requests to a
    Prometheus server (never one per node), or one request per node, all at once,
    each with its own timeout, when scraping nodes directly."""

    @property
    def description(self) -> str: ...

    def read(self) -> FleetState:
        """The fleet now. A node that cannot be read is a `NodeState` with `up=False`
        and `error`; only a source that cannot be read at all (Prometheus down or not
        Prometheus) raises `gpuwatch.errors.SourceError`."""
        ...

    def close(self) -> None: ...
