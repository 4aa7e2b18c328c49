"""What every fleet source is: `read()` gives the fleet now as a `FleetState`; and what a
reader needs of it (`Needs`), so that a source reads no more."""

from __future__ import annotations

from typing import Protocol

import msgspec

from gpuwatch.fleet_model import FleetState

IDLE_AFTER_S = 600.0
"""A held GPU counts as left idle after this long, unless a reader says otherwise (the
screen's default --idle-after, and the window of the recording rules)."""


class Needs(msgspec.Struct, frozen=True):
    """What a reader needs of a fleet. A source that scrapes every node reads it all
    anyway; one that asks Prometheus asks only this (`gpuwatch.fleet.promql.plan`)."""

    placement: bool = False
    """Only what placement's rules read (`gpuwatch where`): no temperature, power, models."""
    free_bytes: int = 0
    """For placement: the free memory each device must have (what the request needs)."""
    verdicts: bool = False
    """For placement at pick's default limits (`Request.judged_as_default`): a gpuwatch
    daemon's own verdict on each GPU will do, in place of its processes and leases."""
    mig: bool = False
    """For placement: MIG devices are asked for."""
    per_node: bool = False
    """The fleet table: a gpuwatch daemon's own figures of its node will do, in place of
    its GPUs one by one."""
    idle_after_s: float = IDLE_AFTER_S
    """The table's idle holders: GPUs held and idle this long."""
    errors: bool = True
    """Why each target Prometheus cannot scrape fails (one more request, where one is
    down); `gpuwatch where` asks it only to say so (`-v`)."""


class FleetSource(Protocol):
    """Reads a fleet. One `read()` costs a fixed, small number of requests to a
    Prometheus server (never one per node), or one request per node, all at once,
    when scraping nodes directly; all within one budget of time and bytes (a read's own,
    or a command's, which all its reads share: `gpuwatch.fleet.fetch.Budget`)."""

    @property
    def description(self) -> str: ...

    def read(self) -> FleetState:
        """The fleet now. A node that cannot be read is a `NodeState` with `up=False` and
        `error`; only a source that cannot be read at all (Prometheus down or not
        Prometheus) raises `gpuwatch.errors.SourceError`."""
        ...

    def close(self) -> None: ...
