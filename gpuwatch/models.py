"""The data model: what one look at a machine's GPUs returns.

Every value carries its unit in its name. `None` always means "this GPU, driver
or process does not report it" (a passively cooled GPU has no `fan_pct`, a
process in another PID namespace has no `user`); it never means zero.
Times are Unix timestamps in seconds.

Text enters the model here, from drivers, scenario files, other nodes, exporters and
schedulers: each value's text is made printable as it is made (`gpuwatch.text`), so a
GPU name or a driver version can never carry an escape sequence to a screen, a JSON
document or a metric label. Text where text belongs is checked to be text.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.text import printable, printable_fields


class ProcessKind(enum.StrEnum):
    """Which of the driver's process lists a process appears in."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    COMPUTE_GRAPHICS = "compute+graphics"
    MPS = "mps"
    """A client of the CUDA Multi-Process Service: its work runs in the MPS server's context."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one moment.

    `index` is the NVML index (PCI bus order, as nvidia-smi shows it), which is
    not necessarily the CUDA ordinal. `error` says why the GPU could not be read
    (lost, reset required, ...); its other metrics are then `None`.
    """

    index: int
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_pct: int | None = None
    memory_utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: int | None = None
    sm_clock_mhz: int | None = None
    performance_state: int | None = None
    error: str | None = None
    mig_enabled: bool | None = None
    """True when the GPU is split into MIG devices (see `Snapshot.mig_devices`), and is
    then never given out whole; False when it is not; `None` when unknown."""
    minor_number: int | None = None
    """N of the GPU's device file `/dev/nvidiaN`: what Slurm's gres.conf names a GPU by
    (`File=`), never assumed to follow `index`; `None` when the driver does not tell."""

    def __post_init__(self) -> None:
        printable_fields(self, "uuid", "name", "pci_bus_id", "error")

    @property
    def ok(self) -> bool:
        """True when the GPU could be read."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG (Multi-Instance GPU) device: a slice of a MIG-enabled GPU, what a job is given.

    `gpu_index` is the parent GPU's NVML index and `index` the device's index
    under it (`0:2` in nvidia-smi and in `label`). `profile` is the size, as
    `1g.10gb`: compute slices and memory. The driver reports no utilization,
    temperature or power for a MIG device, so the model has none.
    """

    gpu_index: int
    index: int
    uuid: str | None
    """`MIG-...`: what CUDA_VISIBLE_DEVICES takes."""
    name: str | None = None
    profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        printable_fields(self, "uuid", "name", "profile", "error")

    @property
    def label(self) -> str:
        """`GPU:MIG` indices, as nvidia-smi and nvitop write them: `0:2`."""
        return f"{self.gpu_index}:{self.index}"


Device = GpuSample | MigDevice
"""What a job can be given: a whole GPU or a MIG device."""


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process's use of one GPU.

    The host fields (`user`, `command`, `cpu_pct`, `rss_bytes`, `started_at`)
    are `None` when the pid is not visible from here: another PID namespace, a
    process that has exited, or access denied. `cpu_pct` is in percent of one
    core: averaged over the process's lifetime the first time it is seen (as
    `ps` shows it), then over the interval since the previous sample (as `top`).
    `command` is the command line quoted as a shell would take it back
    (`python3 -c 'import time; time.sleep(300)'`).
    """

    pid: int
    gpu_index: int
    gpu_uuid: str | None
    memory_used_bytes: int | None
    kind: ProcessKind
    user: str | None = None
    command: str | None = None
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    started_at: float | None = None
    mig_uuid: str | None = None
    """The MIG device it runs in, on a MIG-enabled GPU; `None` elsewhere or when unknown."""
    sm_util_pct: int | None = None
    """Its share of the GPU's SM utilization in the driver's latest sample (nvitop's GPU-SM),
    0 to 100; `None` where the driver does not sample processes (MIG, older GPUs)."""

    def __post_init__(self) -> None:
        printable_fields(self, "gpu_uuid", "user", "command", "mig_uuid")


@dataclass(frozen=True, slots=True)
class Lease:
    """A GPU held by a process, so that no other job is given it.

    `mem_bytes` is the memory the holder declared (`--mem`): the GPU may then
    be shared with other jobs while their declarations fit. `None` means the
    lease is exclusive.
    """

    gpu_uuid: str
    """The GPU's UUID, or a MIG device's (`MIG-...`) for a lease on a MIG device."""
    gpu_index: int
    """The GPU's NVML index; for a MIG device, its parent GPU's."""
    pid: int
    user: str
    """The owner of the lease file, not what the file says."""
    command: str
    started_at: float
    mem_bytes: int | None = None
    lease_id: str = ""
    """Names the lease among all others (its file in the lease directory)."""

    def __post_init__(self) -> None:
        printable_fields(self, "gpu_uuid", "user", "command", "lease_id")

    @property
    def exclusive(self) -> bool:
        """True when no other job may share the GPU."""
        return self.mem_bytes is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All GPUs of one machine and the processes using them, at `taken_at`."""

    taken_at: float
    hostname: str
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcessUsage, ...]
    mig_devices: tuple[MigDevice, ...] = ()
    """The MIG devices of every MIG-enabled GPU, by GPU, then by MIG index."""
    simulated: bool = False
    """True for a simulated node (`--sim`, a scenario file, a `daemon --sim`): its GPUs,
    processes and UUIDs are made up, and every screen says so."""

    def __post_init__(self) -> None:
        printable_fields(self, "hostname", "driver_version", "cuda_driver_version")

    def processes_on(self, gpu_index: int) -> tuple[ProcessUsage, ...]:
        """The processes using the GPU with this NVML index."""
        return tuple(p for p in self.processes if p.gpu_index == gpu_index)

    def mig_devices_of(self, gpu_index: int) -> tuple[MigDevice, ...]:
        """The MIG devices of the GPU with this NVML index (none unless it is MIG-enabled)."""
        return tuple(m for m in self.mig_devices if m.gpu_index == gpu_index)

    def processes_in(self, mig: MigDevice) -> tuple[ProcessUsage, ...]:
        """The processes running in this MIG device."""
        return tuple(p for p in self.processes if mig.uuid and p.mig_uuid == mig.uuid)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict whose keys are the field names; bytes stay integers."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """The inverse of `to_dict` (for snapshots that crossed a process boundary).

        Keys it does not know are ignored, so that a newer daemon may add fields
        without breaking older clients; a change they could not ignore bumps
        `SNAPSHOT_FORMAT_VERSION` instead.
        """
        gpus = tuple(GpuSample(**_known(GpuSample, gpu)) for gpu in data["gpus"])
        processes = tuple(
            ProcessUsage(**{**_known(ProcessUsage, proc), "kind": ProcessKind(proc["kind"])})
            for proc in data["processes"]
        )
        mig_devices = tuple(
            MigDevice(**_known(MigDevice, mig)) for mig in data.get("mig_devices", ())
        )
        return cls(
            taken_at=data["taken_at"],
            hostname=data["hostname"],
            driver_version=data["driver_version"],
            cuda_driver_version=data["cuda_driver_version"],
            gpus=gpus,
            processes=processes,
            mig_devices=mig_devices,
            simulated=data.get("simulated") is True,
        )


SNAPSHOT_FORMAT_VERSION = 1
"""The version of the snapshot's JSON on the daemon's wire (`format_version`). Adding a
field leaves it as it is (`from_dict` ignores keys it does not know); a change an older
client would misread (a field renamed, removed or with another meaning) increments it."""


def _known(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The items of `data` that are fields of the dataclass `cls`."""
    names = cls.__dataclass_fields__
    return {key: value for key, value in data.items() if key in names}


# A fleet: what a fleet source (`gpuwatch.fleet`) returns, one `NodeState` per node.


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


@dataclass(frozen=True, slots=True)
class GpuPod:
    """A Kubernetes pod that holds a GPU, or one MIG device of it, as the node's exporter
    labels the GPU (dcgm-exporter's `pod`, `namespace`, `container`): the GPU is never
    free while it holds it."""

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
    """One node as a fleet source last saw it: one scrape target (`target`), whatever
    name it gives itself.

    `name` is the host its exporter names (its `hostname` label), else the target's
    host; two targets may claim one name (`claims`), and are then two nodes, told apart
    by `label`. `snapshot` holds its GPUs (and MIG devices where the exporter tells
    them) with `snapshot.hostname == name`; it is `None` when nothing was ever read.
    `age_s` is how old its newest data is, judged by the data's own timestamps, not by
    when it was fetched. A node is `up` only when its data is current (not older than
    the source's staleness limit) and its exporter answered; a node that is not up is
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
    (then `snapshot` is `None`, unless `given_only`)."""
    target: str = ""
    """Where it is scraped, which identifies it: the `instance` through Prometheus (with
    its `job` where one instance is in several jobs), `HOST:PORT` scraped directly."""
    job: str | None = None
    """Prometheus's scrape job of the target; `None` scraped directly."""
    claims: int = 1
    """How many targets of the fleet claim `name` (more than 1: they cannot all be it)."""
    pods: tuple[GpuPod, ...] = ()
    """The Kubernetes pods its exporter says hold its GPUs or MIG devices."""
    mig_devices_known: bool = True
    """False where its exporter tells a GPU is MIG-enabled but not its MIG devices
    (nvidia_gpu_exporter reading nvidia-smi): `snapshot.mig_devices` is then not all."""
    given_only: bool = False
    """True where `snapshot` holds only the GPUs its daemon would give a new job now (its
    own verdict by pick's rules, with their free memory and utilization), read for
    `gpuwatch where`: its other GPUs are not free, for reasons it does not tell;
    `summary.gpus` counts them all where the daemon says."""

    @property
    def label(self) -> str:
        """Its name, or where several targets claim that name, `name@target` (`gpu-07@
        10.0.0.7:9400`): what tells it apart in a script's first word."""
        return self.name if self.claims <= 1 or not self.target else f"{self.name}@{self.target}"

    @property
    def key(self) -> str:
        """What identifies it among the nodes of one read: its `label`."""
        return self.label

    def pods_on(self, gpu_index: int) -> tuple[GpuPod, ...]:
        """The pods holding this GPU or one of its MIG devices."""
        return tuple(pod for pod in self.pods if pod.gpu_index == gpu_index)

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
    """All nodes of a fleet at `taken_at`, sorted by name, then target."""

    taken_at: float
    source: str
    """Where it came from, without credentials: `prometheus http://prom:9090`,
    `nodes (12)`."""
    nodes: tuple[NodeState, ...]

    def __post_init__(self) -> None:
        printable_fields(self, "source")
