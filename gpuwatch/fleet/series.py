"""From one target's samples to a `NodeState`, whichever exporter sent them.

A target is one `/metrics` endpoint (a scraped node, or one `job`/`instance` of a
Prometheus server). Its exporter is told by the names of its series: gpuwatch's own
daemon (`gpuwatch_*`), dcgm-exporter (`DCGM_FI_*`) or nvidia_gpu_exporter
(`nvidia_smi_*`); where one machine runs several, gpuwatch's series win, then dcgm's.
The node is named by the series' `hostname` (or `Hostname`) label, else by the
target's host. What an exporter does not tell stays `None`.

Everything here came over the network from a machine someone else runs: every value
is range-checked (a bad one is `None`), and a name is escaped before anyone prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuwatch.fleet import series_dcgm, series_gpuwatch, series_smi
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.mapped import Mapped
from gpuwatch.fleet_model import Exporter, NodeState
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
MAX_NAME_CHARS = 253  # a DNS name's most


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
) -> NodeState:
    """The node one target describes. `seen_at` is when its samples were current (the
    scrape, or the sample timestamp Prometheus kept); `now` is the clock they are judged by."""
    found = target_mapping(samples, fallback_name=fallback_name)
    return judged(found, seen_at=seen_at, now=now, stale_after_s=stale_after_s)


TargetMapping = tuple[str, Exporter, Mapped] | NodeState
"""What a target's samples say, before it is judged by the clock: its name, exporter and
mapped series, or the state of a target that sends none we read."""


def target_mapping(samples: Sequence[Sample], *, fallback_name: str) -> TargetMapping:
    """The work of `target_state` that depends on the samples alone (a source that keeps a
    target's samples between reads keeps this too)."""
    exporter = exporter_of(samples)
    name = safe_name(node_name(samples) or fallback_name)
    if exporter is None:
        return NodeState(
            name,
            up=False,
            snapshot=None,
            error=NO_GPU_METRICS,
        )
    prefix = _prefix(exporter)
    mine = [sample for sample in samples if sample.name.startswith(prefix)]
    return name, exporter, _MAPPERS[exporter](mine, name)


def judged(found: TargetMapping, *, seen_at: float, now: float, stale_after_s: float) -> NodeState:
    """The node a mapping describes, its age and staleness judged at `now`."""
    if isinstance(found, NodeState):
        return found
    name, exporter, mapped = found
    data_at, age_s = aged(seen_at, mapped.data_at, now)
    error = mapped.error
    if error is None and not mapped.gpus:
        error = NO_GPU
    error = error or stale(age_s, stale_after_s)
    snapshot = Snapshot(
        taken_at=data_at,
        hostname=name,
        driver_version=mapped.driver_version,
        cuda_driver_version=mapped.cuda_driver_version,
        gpus=mapped.gpus,
        processes=mapped.processes,
        mig_devices=mapped.mig_devices,
        simulated=mapped.simulated,
    )
    return NodeState(
        name,
        up=error is None,
        snapshot=snapshot if mapped.gpus else None,
        age_s=age_s,
        error=error,
        exporter=exporter,
        leases=mapped.leases,
        lease_waiters=mapped.lease_waiters,
        longest_wait_s=mapped.longest_wait_s,
        jobs=mapped.jobs,
    )


def aged(seen_at: float, data_at: float | None, now: float) -> tuple[float, float]:
    """When a node's data was taken (its exporter's own time where it tells one, never
    after the read that saw it) and its age at `now`."""
    taken_at = seen_at if data_at is None else min(seen_at, data_at)
    return taken_at, max(0.0, now - taken_at)


def stale(age_s: float, stale_after_s: float) -> str | None:
    """Why a node is not up when its data is older than `stale_after_s`, else `None`."""
    if age_s <= stale_after_s:
        return None
    return f"stale: its newest data is {age_s:.0f}s old (the limit is {stale_after_s:g}s)"


def merged(states: Iterable[NodeState]) -> tuple[NodeState, ...]:
    """One state per node name, sorted: where two targets name the same node (gpuwatch's
    daemon and dcgm-exporter on one machine), the one that is up wins, then the exporter
    that tells more."""
    best: dict[str, NodeState] = {}
    for state in states:
        if (held := best.get(state.name)) is None or _rank(state) < _rank(held):
            best[state.name] = state
    return tuple(sorted(best.values(), key=lambda node: node.name))


def _rank(state: NodeState) -> tuple[bool, int]:
    exporter = _PRIORITY.index(state.exporter) if state.exporter else len(_PRIORITY)
    return (not state.up, exporter)


def node_name(samples: Iterable[Sample]) -> str | None:
    """The host the series name, from their `hostname` or `Hostname` label."""
    for sample in samples:
        for key in ("hostname", "Hostname"):
            if value := sample.labels.get(key):
                return value
    return None


def host_of(instance: str) -> str:
    """A node's name from a Prometheus `instance` (`node1:9400`, `[fd00::1]:9400`): its
    host, so that it names the machine as `ssh` takes it."""
    host, colon, port = instance.rpartition(":")
    if not colon or not port.isdigit():
        return instance
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def safe_name(text: str) -> str:
    """`text` with every character a terminal would act on escaped (`\\x1b`), and cut to
    a DNS name's length: node names come from labels anyone on a node can set."""
    cut = text[:MAX_NAME_CHARS]
    if cut.isprintable() and cut.strip() == cut and cut:
        return cut
    escaped = "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in cut)
    return escaped.strip() or "(unnamed)"


def shown_address(text: str) -> str:
    """An address someone typed, safe to print: escaped, and any `user:password@` hidden."""
    scheme, sep, rest = text.rpartition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return safe_name(f"{scheme}{sep}{netloc}{slash}{path}")


def _escape(ch: str) -> str:
    code = ord(ch)
    return "\\\\" if ch == "\\" else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _prefix(exporter: Exporter) -> str:
    return PREFIXES[_PRIORITY.index(exporter)]
