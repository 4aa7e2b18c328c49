"""A fleet's vocabulary: what a fleet source returns, one `NodeState` per node.

Apart from `gpuwatch.models` (one machine's look) so that a command that reads one machine
does not build the fleet's classes: the four dataclasses here cost 21 M instructions of
`gpuwatch status --json`'s 614 M (8 simulated GPUs, counted by callgrind).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpuwatch.models import Lease, Snapshot
from gpuwatch.text import printable, printable_fields


@dataclass(frozen=True, slots=True)
class GpuJob:
    """The scheduler's job on one GPU of a node (Slurm's, as the node's daemon exports it)."""

    gpu_index: int
    job_id: str
    user: str | None
    allocated_idle_s: float | None = None
    """How long the job has left the GPU idle (0 while it computes); `None`: not told."""

    def __post_init__(self) -> None:
        printable_fields(self, "job_id", "user")


class Exporter(enum.StrEnum):
    """Which exporter's series described a node."""

    GPUWATCH = "gpuwatch"
    DCGM = "dcgm"
    NVIDIA_GPU_EXPORTER = "nvidia_gpu_exporter"


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """A node's figures as a Prometheus server's recording rules precompute them
    (`examples/gpuwatch-fleet-rules.yml`): what the fleet table shows of it, without its
    GPUs one by one. `None` is unknown."""

    gpus: int | None
    gpus_free: int | None
    """GPUs where a plain `gpuwatch pick` would take one."""
    most_free_bytes: int | None
    memory_free_bytes: int | None
    utilization_pct: float | None
    hottest_c: int | None
    power_w: float | None
    leases: int | None
    idle_held: int | None
    """GPUs held (a lease, or a process holding memory) but idle for 10 minutes."""
    users: tuple[tuple[str, int, int], ...] = ()
    """(user, GPUs, memory bytes) of each user with processes there."""
    models: tuple[str, ...] = ()
    jobs: int | None = None
    """The scheduler's jobs holding its GPUs; `None` where its jobs are unknown."""
    idle_allocated: int | None = None
    """GPUs a job holds and has left idle for 10 minutes, by its daemon's watch."""
    simulated: bool = False
    """Its daemon serves a simulated node (`gpuwatch_simulated`): its GPUs are made up."""

    def __post_init__(self) -> None:
        if not all(user.isprintable() for user, _, _ in self.users):
            users = tuple((printable(user), gpus, memory) for user, gpus, memory in self.users)
            object.__setattr__(self, "users", users)
        if not all(model.isprintable() for model in self.models):
            object.__setattr__(self, "models", tuple(printable(model) for model in self.models))


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as a fleet source last saw it.

    `snapshot` holds its GPUs (and MIG devices where the exporter tells them) with
    `snapshot.hostname == name`; it is `None` when nothing was ever read. `age_s` is
    how old its newest data is, judged by the data's own timestamps, not by when it
    was fetched. A node is `up` only when its data is current (not older than the
    source's staleness limit) and its exporter answered; a node that is not up is
    shown with its age and `error`, and `where` never places a job on it.
    """

    name: str
    up: bool
    snapshot: Snapshot | None
    age_s: float | None = None
    error: str | None = None
    exporter: Exporter | None = None
    leases: tuple[Lease, ...] | None = None
    """The node's leases, as far as its metrics tell them (a lease's pid, user and
    command are unknown there: pid 0, empty texts); `None` where the node runs another
    exporter and leases cannot be known."""
    lease_waiters: int | None = None
    """Jobs waiting in line for its GPUs (`pick --wait`); `None` where the exporter does
    not tell (another exporter, a gpuwatch daemon before the line was exported)."""
    longest_wait_s: float | None = None
    """How long the oldest of them has waited (0 with none); `None` as `lease_waiters`."""
    jobs: tuple[GpuJob, ...] | None = None
    """The scheduler's job on each GPU a job holds; `()`: no GPU is held by a job; `None`:
    jobs unknown (another exporter, no scheduler there, or it did not answer in time)."""
    summary: NodeSummary | None = None
    """Its figures from recording rules, where the source read those instead of its GPUs
    (then `snapshot` is `None`)."""

    def __post_init__(self) -> None:
        printable_fields(self, "name", "error")

    @property
    def simulated(self) -> bool:
        """Whether the node is simulated (its GPUs made up), as its snapshot or its figures
        say; False where neither was read."""
        if self.snapshot is not None:
            return self.snapshot.simulated
        return self.summary is not None and self.summary.simulated

    def jobs_on(self, gpu_index: int) -> tuple[GpuJob, ...]:
        """The jobs holding this GPU (usually one), as far as they are known."""
        return tuple(job for job in self.jobs or () if job.gpu_index == gpu_index)


@dataclass(frozen=True, slots=True)
class FleetState:
    """All nodes of a fleet at `taken_at`, sorted by name."""

    taken_at: float
    source: str
    """Where it came from, without credentials: `prometheus http://prom:9090`,
    `nodes (12)`."""
    nodes: tuple[NodeState, ...]

    def __post_init__(self) -> None:
        printable_fields(self, "source")
