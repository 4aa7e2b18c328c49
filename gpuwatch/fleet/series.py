"""From one target's samples to a `NodeState`, whichever exporter sent them.

A target is one `/metrics` endpoint (a scraped node, or one `job`/`instance` of a
Prometheus server), and a node is a target: two targets are two nodes, whatever names
they give themselves (`claimed` counts who claims each name). Its exporter is told by the
names of its series: gpuwatch's own daemon (`gpuwatch_*`), dcgm-exporter (`DCGM_FI_*`) or
nvidia_gpu_exporter (`nvidia_smi_*`); where one target sends several, gpuwatch's series
win, then dcgm's. The node is named by the series' `hostname` (or `Hostname`) label,
never where that is a Kubernetes pod's name (an exporter pod without `NODE_NAME` names
itself), else by the target's host. What an exporter does not tell stays `None`.

Everything here came over the network from a machine someone else runs: every value
is range-checked (a bad one is `None`), and a name is escaped before anyone prints it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from msgspec.structs import replace

from gpuwatch.fleet import series_dcgm, series_gpuwatch, series_smi
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import Mapped, on_mig_gpus
from gpuwatch.fleet.names import node_text
from gpuwatch.fleet_model import Exporter, NodeState
from gpuwatch.holders import holders_on
from gpuwatch.models import Snapshot

PREFIXES = ("gpuwatch_", "DCGM_FI_", "nvidia_smi_")
"""Every series the fleet reads starts with one of these."""
FAMILIES = (*series_gpuwatch.FAMILIES, *series_dcgm.FAMILIES, *series_smi.FAMILIES)
"""Every metric name the fleet reads, for a Prometheus selector."""
_PRIORITY = (Exporter.GPUWATCH, Exporter.DCGM, Exporter.NVIDIA_GPU_EXPORTER)
_MAPPERS = {
    Exporter.GPUWATCH: series_gpuwatch.mapped,
    Exporter.DCGM: series_dcgm.mapped,
    Exporter.NVIDIA_GPU_EXPORTER: series_smi.mapped,
}
NO_GPU_METRICS = (
    "no GPU metrics there: is it a gpuwatch daemon, dcgm-exporter or nvidia_gpu_exporter?"
)
NO_GPU = "its exporter answers but reports no GPU"
EXPORTER_POD = re.compile(r".*dcgm-exporter-[bcdfghjklmnpqrstvwxz2456789]{5}")
"""The name of a pod of dcgm-exporter's DaemonSet (`nvidia-dcgm-exporter-wqqqn`: the
five characters Kubernetes draws for a pod's name): the exporter's `hostname` label
where no `NODE_NAME` was given it, which names the pod, not the node."""
NOT_NAMES = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1"})
"""Host labels that name no node of a fleet: dcgm-exporters reading a host engine
through `-r localhost:5555` all say `localhost`."""
NO_LABELS: Mapping[str, str] = {}


def exporter_of(samples: Sequence[Sample]) -> Exporter | None:
    """Which exporter sent these samples, by the priority above; `None`: none we read."""
    names = {sample.name for sample in samples}
    for exporter, prefix in zip(_PRIORITY, PREFIXES, strict=True):
        if any(name.startswith(prefix) for name in names):
            return exporter
    return None


def target_state(
    samples: Sequence[Sample],
    *,
    fallback_name: str,
    seen_at: float,
    now: float,
    stale_after_s: float,
    target: str = "",
    job: str | None = None,
    scraped_as: Mapping[str, str] = NO_LABELS,
) -> NodeState:
    """The node one target describes. `seen_at` is when its samples were current (the
    scrape, or the sample timestamp Prometheus kept); `now` is the clock they are judged
    by; `target` (and `job`) where it is scraped; `scraped_as`, the labels Prometheus
    gives every series of the target (`up`'s): on Kubernetes, the exporter pod's own."""
    found = target_mapping(samples, fallback_name=fallback_name, scraped_as=scraped_as)
    return judged(
        found, seen_at=seen_at, now=now, stale_after_s=stale_after_s, target=target, job=job
    )


TargetMapping = tuple[str, Exporter, Mapped] | NodeState
"""What a target's samples say, before it is judged by the clock: its name, exporter and
mapped series, or the state of a target that sends none we read."""


def target_mapping(
    samples: Sequence[Sample], *, fallback_name: str, scraped_as: Mapping[str, str] = NO_LABELS
) -> TargetMapping:
    """The work of `target_state` that depends on the samples alone."""
    exporter = exporter_of(samples)
    name = node_text(node_name(samples, scraped_as) or fallback_name)
    if exporter is None:
        return NodeState(name, up=False, snapshot=None, error=NO_GPU_METRICS)
    prefix = _prefix(exporter)
    mine = [sample for sample in samples if sample.name.startswith(prefix)]
    return name, exporter, _MAPPERS[exporter](mine, name, scraped_as)


def judged(
    found: TargetMapping,
    *,
    seen_at: float,
    now: float,
    stale_after_s: float,
    target: str = "",
    job: str | None = None,
) -> NodeState:
    """The node a mapping describes, its age and staleness judged at `now`, scraped at
    `target` (and `job`)."""
    if isinstance(found, NodeState):
        return replace(found, target=target, job=job) if target or job else found
    name, exporter, mapped = found
    data_at, age_s = aged(seen_at, mapped.data_at, now)
    error = mapped.error
    if error is None and not mapped.gpus:
        error = NO_GPU
    error = error or stale(age_s, stale_after_s)
    mig_devices = on_mig_gpus(mapped.gpus, mapped.mig_devices)
    snapshot = Snapshot(
        taken_at=data_at,
        hostname=name,
        driver_version=mapped.driver_version,
        cuda_driver_version=mapped.cuda_driver_version,
        gpus=mapped.gpus,
        processes=mapped.processes,
        mig_devices=mig_devices,
        simulated=mapped.simulated,
    )
    claims = mapped.claims
    holders = holders_on(snapshot, claims.held, claims.unknown, unknown_why=claims.unknown_why)
    return NodeState(
        name,
        up=error is None,
        snapshot=snapshot if mapped.gpus else None,
        data_at=data_at,
        error=error,
        exporter=exporter,
        leases=mapped.leases,
        lease_waiters=mapped.lease_waiters,
        longest_wait_s=mapped.longest_wait_s,
        jobs=mapped.jobs,
        holders=holders,
        mig_devices_known=mapped.mig_devices_known,
        target=target,
        job=job,
    )


def aged(seen_at: float, data_at: float | None, now: float) -> tuple[float, float]:
    """When a node's data was taken (its exporter's own time where it tells one, never
    after the read that saw it) and its age at `now`."""
    taken_at = seen_at if data_at is None else min(seen_at, data_at)
    return taken_at, max(0.0, now - taken_at)


def stale(age_s: float, stale_after_s: float) -> str | None:
    """Why a node is not up when its data is older than `stale_after_s`, else `None`. It
    names the limit, not the age, which a screen shows beside it as it grows."""
    if age_s <= stale_after_s:
        return None
    return f"stale: its newest data is older than the limit of {stale_after_s:g}s"


def judged_again(node: NodeState, now: float, stale_after_s: float) -> NodeState:
    """`node` judged again at `now`, without new samples: the very same node while its
    data is current at `now` (or it is not up for a reason of its own), else stale."""
    if not node.up or node.data_at is None or now - node.data_at <= stale_after_s:
        return node
    return replace(node, up=False, error=stale(now - node.data_at, stale_after_s))


def claimed(states: Iterable[NodeState]) -> tuple[NodeState, ...]:
    """Every target's node, sorted by name then target, each told how many targets claim
    its name: two daemons given one `--node-name`, exporters that all say `localhost`,
    or a node naming itself after another are as many nodes, none hiding another."""
    nodes = sorted(states, key=attrgetter("name", "target"))
    counts = Counter(map(attrgetter("name"), nodes))
    return tuple(
        node if counts[node.name] == node.claims else replace(node, claims=counts[node.name])
        for node in nodes
    )


def node_name(samples: Iterable[Sample], scraped_as: Mapping[str, str] = NO_LABELS) -> str | None:
    """The host the series name, from their `hostname` or `Hostname` label, unless that
    names a pod (the target's own, `scraped_as`, or a dcgm-exporter pod) or no host of a
    fleet (`localhost`)."""
    for sample in samples:
        for key in ("hostname", "Hostname"):
            value = sample.labels.get(key)
            if value and host_named(value, scraped_as):
                return value
    return None


def host_named(value: str, scraped_as: Mapping[str, str] = NO_LABELS) -> bool:
    """Whether a host label's `value` names a node (see `node_name`)."""
    pod = value == scraped_as.get("pod") or EXPORTER_POD.fullmatch(value) is not None
    return not pod and value not in NOT_NAMES


def _prefix(exporter: Exporter) -> str:
    return PREFIXES[_PRIORITY.index(exporter)]
