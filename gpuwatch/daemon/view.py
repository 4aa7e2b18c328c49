"""What the daemon knows at one moment: one `View` per request, read once.

A request (a route, a scrape of `/metrics`) takes one view and answers from it
alone, so that the snapshot, whether it is current, the leases and the
training reports it shows all belong together, and the lease directory is
listed at most once per request, only by the requests that show leases.
"""

from __future__ import annotations

import msgspec

from gpuwatch.daemon.job_watch import NO_JOBS, JobsNow
from gpuwatch.daemon.node import host_name
from gpuwatch.models import Lease, Snapshot
from gpuwatch.reports.training import TrainingReports
from gpuwatch.request import Waiter
from gpuwatch.sampling.poller import PollState

NO_REPORTS = TrainingReports()


class View(msgspec.Struct, frozen=True):
    state: PollState
    """The poller's state when the view was taken: the snapshot, and how sampling goes."""
    stale: str | None = None
    """Why the snapshot must not pass for current (sampling fails or stalls); `None` when
    it may, or when there is no snapshot yet."""
    leases: tuple[Lease, ...] = ()
    """The leases in force; read only for a view that shows them, and while current."""
    leases_skipped: int = 0
    waiters: tuple[Waiter, ...] = ()
    """The jobs in line for GPUs (`pick --wait`), oldest first; read with the leases."""
    training: TrainingReports = NO_REPORTS
    node_name: str | None = None
    """`--node-name`; `None`: the name the source gives the node."""
    jobs: JobsNow = NO_JOBS
    """Which job holds each GPU, and for how long held GPUs have been idle."""
    simulated: bool = False
    """Whether the node is simulated (`daemon --sim`): `gpuwatch_simulated` says so."""

    @property
    def node(self) -> str:
        """The node's name: the `hostname` label of every series."""
        if self.node_name is not None:
            return self.node_name
        return self.snapshot.hostname if self.snapshot is not None else host_name()

    @property
    def snapshot(self) -> Snapshot | None:
        return self.state.snapshot

    @property
    def current(self) -> bool:
        """Whether there is a snapshot and it may be served as current."""
        return self.state.snapshot is not None and self.stale is None
