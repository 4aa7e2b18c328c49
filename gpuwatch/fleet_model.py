"""A fleet's vocabulary: what a fleet source returns, one `NodeState` per node.

Apart from `gpuwatch.models` (one machine's look) so that a command that reads one machine
does not build the fleet's classes: the fleet's dataclasses cost 21 M instructions of
`gpuwatch status --json`'s 614 M (8 simulated GPUs, counted by callgrind).
"""

from __future__ import annotations

import enum

import msgspec

from gpuwatch.holders import NO_HOLDERS, Holder, HolderKind, Holders
from gpuwatch.models import Device, Lease, Snapshot
from gpuwatch.node_figures import leases_on, node_figures
from gpuwatch.text import printable, printable_fields


class GpuJob(msgspec.Struct, frozen=True):
    """The scheduler's job on one GPU of a node (Slurm's, as the node's daemon exports it)."""

    gpu_index: int
    job_id: str
    user: str | None
    allocated_idle_s: float | None = None
    """How long the job has left the GPU idle (0 while it computes); `None`: not told."""

    def __post_init__(self) -> None:
        printable_fields(self, "job_id", "user")


class GpuPod(msgspec.Struct, frozen=True):
    """A Kubernetes pod that holds a GPU, or one MIG device of it, as the node's exporter
    labels the GPU (dcgm-exporter's `pod`, `namespace`, `container`; a gpuwatch daemon's
    `gpuwatch_gpu_pod_info`): the GPU is never free while it holds it. What a screen shows
    of a node's holders (`NodeState.pods`)."""

    gpu_index: int
    namespace: str
    pod: str
    container: str | None = None
    gpu_instance_id: int | None = None
    """The MIG device's GPU instance where the pod holds one, `None` for the whole GPU."""

    @property
    def name(self) -> str:
        """`namespace/pod`, as kubectl names it."""
        return f"{self.namespace}/{self.pod}"

    @property
    def user(self) -> str:
        """The pod as a user of the node: `(namespace/pod)`, as the fleet's users view and
        its filter name it."""
        return f"({self.name})"


class Exporter(enum.StrEnum):
    """Which exporter's series described a node."""

    GPUWATCH = "gpuwatch"
    DCGM = "dcgm"
    NVIDIA_GPU_EXPORTER = "nvidia_gpu_exporter"


class NodeSummary(msgspec.Struct, frozen=True):
    """A node's figures as a whole: what the fleet table shows of it (`NodeState.figures`),
    as a Prometheus server's recording rules precompute them from its daemon's series
    (`examples/gpuwatch-fleet-rules.yml`), or as worked out from its GPUs. `None` is
    unknown."""

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
    """GPUs held (a lease, or a process holding memory) but idle for 10 minutes; `None`
    also while Prometheus holds less than 10 minutes of the node's data."""
    users: tuple[tuple[str, int, int], ...] | None = ()
    """(user, GPUs, memory bytes) of each user with processes there (with its GPUs at
    hand, also of each user whose job holds a GPU, and each pod holding one, named
    `GpuPod.user`); `""` where a process's user is not known; `None` while not known yet
    (Prometheus has not evaluated them over a scrape of the node)."""
    models: tuple[str, ...] = ()
    jobs: int | None = None
    """The scheduler's jobs holding its GPUs; `None` where its jobs are unknown."""
    idle_allocated: int | None = None
    """GPUs a job holds and has left idle for 10 minutes, by its daemon's watch."""
    simulated: bool = False
    """Its daemon serves a simulated node (`gpuwatch_simulated`): its GPUs are made up."""

    def __post_init__(self) -> None:
        if self.users is not None and not all(user.isprintable() for user, _, _ in self.users):
            users = tuple((printable(user), gpus, memory) for user, gpus, memory in self.users)
            msgspec.structs.force_setattr(self, "users", users)
        if not all(model.isprintable() for model in self.models):
            msgspec.structs.force_setattr(
                self, "models", tuple(printable(model) for model in self.models)
            )


class NodeState(msgspec.Struct, frozen=True, gc=False):
    """One node as a fleet source last saw it: one scrape target (`target`), whatever
    name it gives itself.

    Not tracked by the garbage collector: nothing it holds refers back to it, so it is
    never part of a cycle, and the fleet table keeps 10,000 of them, which every full
    pass of the collector would walk (bench/fleet_scale.py: a fifth of a refresh's CPU).

    `name` is the host its exporter names (its `hostname` label), else the target's
    host; two targets may claim one name (`claims`), and are then two nodes, told apart
    by `label`. `snapshot` holds its GPUs one by one (and MIG devices where the exporter
    tells them) with `snapshot.hostname == name`, where they were read; `figures` holds
    what it is as a whole however it was read (its GPUs, or its daemon's figures), and is
    `None` only when nothing was ever read: what the table shows of it.
    `data_at` is when its newest data was taken, by the data's own timestamps, not when
    it was fetched; its age is `age_at(fleet.taken_at)`. A node is `up` only when, at the
    read's `taken_at`, its data is current (not older than the source's staleness limit)
    and its exporter answered; a node that is not up is shown with its age and `error`,
    and `where` never places a job on it. A node whose series did not change since a
    source's last read is the very same object (only judged stale once its data grows
    too old), so that its readers (the table's rows) can keep what they made of it.
    """

    name: str
    up: bool
    snapshot: Snapshot | None
    data_at: float | None = None
    """When its newest data was taken (Unix time); `None` where that is not known."""
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
    """Its figures as its exporter tells them of it as a whole: a gpuwatch daemon's, read
    through recording rules instead of its GPUs (then `snapshot` is `None`, unless the
    node is in focus), or its daemon's count of its GPUs and of those it would give out,
    beside `offered`. Its readers read `figures`, which a node read GPU by GPU has too."""
    target: str = ""
    """Where it is scraped, which identifies it: the `instance` through Prometheus (with
    its `job` where one instance is in several jobs), `HOST:PORT` scraped directly."""
    job: str | None = None
    """Prometheus's scrape job of the target; `None` scraped directly."""
    claims: int = 1
    """How many targets of the fleet claim `name` (more than 1: they cannot all be it)."""
    holders: Holders = NO_HOLDERS
    """Who holds each of its devices for the cluster (its scheduler's jobs, its pods), and
    which nobody can tell about, as its exporter tells: what `where` and the table's free
    count judge by (`gpuwatch.holders`)."""
    mig_devices_known: bool = True
    """False where its exporter tells a GPU is MIG-enabled but not its MIG devices
    (nvidia_gpu_exporter reading nvidia-smi): `snapshot.mig_devices` is then not all."""
    offered: Snapshot | None = None
    """Where the node was read as its daemon's verdict (`gpuwatch where`, at pick's default
    limits): the GPUs the daemon would give a new job now, with their free memory and
    utilization. Its other GPUs are not free, for reasons it does not tell;
    `summary.gpus` counts them all where the daemon says. `snapshot` is then `None`: its
    GPUs were not read one by one."""

    @property
    def label(self) -> str:
        """Its name, or where several targets claim that name, `name@target` (`gpu-07@
        10.0.0.7:9400`): what tells it apart in a script's first word."""
        return self.name if self.claims <= 1 or not self.target else f"{self.name}@{self.target}"

    @property
    def key(self) -> str:
        """What identifies it among the nodes of one read: its `label`."""
        return self.label

    @property
    def pods(self) -> tuple[GpuPod, ...]:
        """The Kubernetes pods that hold its GPUs or MIG devices, as `holders` says: each
        pod of a device several share, a pod of a whole GPU once (not again on each of its
        MIG devices)."""
        if not self.holders.held or self.snapshot is None:
            return ()
        snapshot = self.snapshot
        found = [pod for gpu in snapshot.gpus for pod in self._pods(gpu, gpu.index, None, ())]
        for device in snapshot.mig_devices:
            gpu = next((g for g in snapshot.gpus if g.index == device.gpu_index), None)
            whole = self.holders.holders_of(gpu) if gpu is not None else ()
            found += self._pods(device, device.gpu_index, device.gpu_instance_id, whole)
        return tuple(found)

    def _pods(
        self, device: Device, gpu: int, instance: int | None, whole: tuple[Holder, ...]
    ) -> list[GpuPod]:
        return [
            GpuPod(gpu, *holder.name.partition("/")[::2], holder.container, instance)
            for holder in self.holders.holders_of(device)
            if holder.kind is HolderKind.POD and holder not in whole
        ]

    def pods_on(self, gpu_index: int) -> tuple[GpuPod, ...]:
        """The pods holding this GPU or one of its MIG devices."""
        return tuple(pod for pod in self.pods if pod.gpu_index == gpu_index)

    def __post_init__(self) -> None:
        printable_fields(self, "name", "error")

    @property
    def figures(self) -> NodeSummary | None:
        """Its figures as a whole, however it was read: as its exporter tells them
        (`summary`), else worked out from its GPUs (`snapshot`), by the daemon's own
        definition (`gpuwatch.node_figures`); `None` where nothing was read. From its GPUs,
        what only a watch over time or pick's rule can tell is `None`: the GPUs a plain
        pick would take, and the held GPUs idle long enough."""
        if self.summary is not None:
            return self.summary
        snapshot = self.snapshot
        if snapshot is None:
            return None
        return NodeSummary(
            **msgspec.structs.asdict(node_figures(snapshot.gpus, snapshot.mig_devices)),
            gpus_free=None,
            leases=None if self.leases is None else leases_on(snapshot, self.leases),
            idle_held=None,
            users=self._users(snapshot),
            models=tuple(sorted({g.name for g in snapshot.gpus if g.error is None and g.name})),
            jobs=None if self.jobs is None else len({job.job_id for job in self.jobs}),
            simulated=snapshot.simulated,
        )

    def _users(self, snapshot: Snapshot) -> tuple[tuple[str, int, int], ...]:
        """(user, GPUs, memory bytes) of whoever runs a process there, whose job holds a
        GPU there, and of each pod holding one."""
        gpus: dict[str, set[int]] = {}
        memory: dict[str, int] = {}
        for process in snapshot.processes:
            user = process.user or ""
            gpus.setdefault(user, set()).add(process.gpu_index)
            memory[user] = memory.get(user, 0) + (process.memory_used_bytes or 0)
        for job in self.jobs or ():
            gpus.setdefault(job.user or "", set()).add(job.gpu_index)
        for pod in self.pods:
            gpus.setdefault(pod.user, set()).add(pod.gpu_index)
        return tuple((user, len(held), memory.get(user, 0)) for user, held in sorted(gpus.items()))

    @property
    def simulated(self) -> bool:
        """Whether the node is simulated (its GPUs made up), as its snapshot or its figures
        say; False where neither was read."""
        if self.snapshot is not None:
            return self.snapshot.simulated
        return self.summary is not None and self.summary.simulated

    def age_at(self, now: float) -> float | None:
        """How old its newest data is at `now` (its fleet's `taken_at`); `None` where
        unknown."""
        return data_age(self.data_at, now)

    def jobs_on(self, gpu_index: int) -> tuple[GpuJob, ...]:
        """The jobs holding this GPU (usually one), as far as they are known."""
        return tuple(job for job in self.jobs or () if job.gpu_index == gpu_index)


class FleetState(msgspec.Struct, frozen=True):
    """All nodes of a fleet at `taken_at`, sorted by name, then target."""

    taken_at: float
    source: str
    """Where it came from, without credentials: `prometheus http://prom:9090`,
    `nodes (12)`."""
    nodes: tuple[NodeState, ...]

    def __post_init__(self) -> None:
        printable_fields(self, "source")


def data_age(data_at: float | None, now: float) -> float | None:
    """How old data taken at `data_at` is at `now` (never less than 0: clocks differ);
    `None` where `data_at` is not known."""
    return None if data_at is None else max(0.0, now - data_at)
