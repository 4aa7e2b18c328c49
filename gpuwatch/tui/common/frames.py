"""Frames: what the screen shows of one machine at one moment, and its past.

A frame is made on a worker thread (a node screen's source, or the fleet's read of one
node) and drawn on the UI thread. Pure, and without Textual.
"""

from __future__ import annotations

import msgspec

from gpuwatch.gpu_history import GpuSeries
from gpuwatch.jobs.job_table import NodeJobs
from gpuwatch.models import Lease, Snapshot
from gpuwatch.reports.training import TrainingReports
from gpuwatch.request import Waiter
from gpuwatch.text import printable_fields

NO_TRAINING = TrainingReports()


class HostStats(msgspec.Struct, frozen=True):
    """The machine's CPU, memory, swap and load, as `top` shows them."""

    cpu_pct: float
    cpu_count: int
    memory_used_bytes: int
    memory_total_bytes: int
    swap_used_bytes: int
    swap_total_bytes: int
    load_1m: float
    load_5m: float
    load_15m: float


class Ancestor(msgspec.Struct, frozen=True):
    """What the tree view needs of a process: its parent, owner and name."""

    pid: int
    ppid: int
    user: str | None
    name: str


class Frame(msgspec.Struct, frozen=True):
    """What one source said at one moment.

    `snapshot` is `None` when the source failed as a whole this time; `error` says why.
    """

    source: str
    snapshot: Snapshot | None
    leases: tuple[Lease, ...] = ()
    waiters: tuple[Waiter, ...] = ()
    host: HostStats | None = None
    error: str | None = None
    local: bool = True
    """Whether the processes are on this machine (so they can be inspected and signalled)."""
    ancestors: tuple[Ancestor, ...] = ()
    """The GPU processes and their ancestors, read only while the tree view is on."""
    training: TrainingReports = NO_TRAINING
    """The training processes `gpuwatch.torch.watch()` watches there, for sources that read
    them: read on the source's thread, so a slow lease directory never holds up the screen."""
    jobs: NodeJobs | None = None
    """Who holds each GPU (the daemon's or this node's Slurm's word); `None`: not asked."""

    def __post_init__(self) -> None:
        # The model's text is printable already; a source's name and its failure (an ssh
        # host's own words) enter the screen here.
        printable_fields(self, "source", "error")


class Backfill(msgspec.Struct, frozen=True):
    """Samples from before the screen opened (the daemon's history), oldest first."""

    source: str
    series: tuple[GpuSeries, ...] = ()
    note: str = ""
    """Where the graphs' past comes from, for the user: 'daemon history, 60m'."""
