"""Which nodes of a fleet could run a job now: the placement rules, run on each node.

`where()` takes a `FleetState` (what a fleet source read) and a request, and
runs `rules.place()` on every node's snapshot and leases, exactly as `pick`
runs it on this machine's: the same candidates, the same in-use rule, the same
refusals. A node that is down or stale never counts; neither does a GPU (or MIG device)
of unknown free memory, nor one a job of the cluster holds (a Slurm job, a Kubernetes
pod) or whose holders nobody can tell, as far as the node's exporter tells
(`NodeState.holders`, the one model of holders: `gpuwatch.holders`). Leases
are known only where a node runs gpuwatch: on a node of another exporter a lease cannot
keep a job off a GPU, and the answer says so (`NodeFit.leases_known`). A node is named
by its `NodeState.label`: `gpu-07`, or `gpu-07@10.0.0.7:9400` where several targets
claim that name.

No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

from gpuwatch.choices import Strategy
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import FleetState, NodeState
from gpuwatch.models import Device, GpuSample, Snapshot
from gpuwatch.placement.gpus import kind_for
from gpuwatch.placement.rules import Kind, Never, needed_bytes, never, place
from gpuwatch.request import Request
from gpuwatch.units import counted, format_size, format_span


def needs_of(request: Request, *, errors: bool = False) -> Needs:
    """What `where` needs of a fleet to place `request`: placement's series, devices with
    its free memory, MIG devices where it asks for them, and at pick's default limits a
    daemon's own verdict on each GPU; why a node is down only with `errors`."""
    return Needs(
        placement=True,
        free_bytes=needed_bytes(request),
        verdicts=request.judged_as_default,
        mig=request.mig is not None,
        errors=errors,
    )


class NodeFit(msgspec.Struct, frozen=True):
    """A node that could run the job now, and the devices it would be given, best first."""

    node: str
    devices: tuple[Device, ...]
    free_bytes: tuple[int, ...]
    """Each device's free memory, less what shared leases there have declared."""
    leases_known: bool

    @property
    def memory_free_bytes(self) -> int:
        """The chosen devices' free memory together."""
        return sum(self.free_bytes)

    @property
    def utilization_pct(self) -> float:
        """The chosen GPUs' mean utilization (100 where unknown; 0 for MIG devices, which
        report none)."""
        values = [_utilization(device) for device in self.devices]
        return sum(values) / len(values) if values else 0.0


class NodeMiss(msgspec.Struct, frozen=True):
    """A node that cannot run the job now, and why: one line for the node (down,
    stale, too small for ever), or one per device, as `pick` explains itself."""

    node: str
    summary: str
    reasons: tuple[str, ...] = ()
    qualifying: int = 0
    """How many devices qualify (fewer than asked for): closer nodes come first."""
    leases_known: bool = True


class Answer(msgspec.Struct, frozen=True):
    """The nodes that fit, best first, and the rest, closest first."""

    fits: tuple[NodeFit, ...]
    misses: tuple[NodeMiss, ...]


def where(
    fleet: FleetState,
    request: Request,
    *,
    excluded_nodes: Collection[str] = (),
    explain: bool = True,
) -> Answer:
    """The nodes of `fleet` that could run `request` now, ranked by `request.strategy`:
    `most-free`, the most free memory on the chosen devices together first; `pack`, the
    least that fits first; `least-util`, the least busy chosen GPUs first. Ties go by
    node label. `excluded_nodes` names nodes by name (every target claiming it) or label.
    `explain=False`: a miss tells no device's reason (`explained` tells those of the few
    misses shown), and costs no text per device."""
    fits: list[NodeFit] = []
    misses: list[NodeMiss] = []
    for node in fleet.nodes:
        if node.name in excluded_nodes or node.label in excluded_nodes:
            continue
        outcome = _on_node(node, request, explain, fleet.taken_at)
        if isinstance(outcome, NodeFit):
            fits.append(outcome)
        else:
            misses.append(outcome)
    fits.sort(key=lambda fit: _rank(fit, request.strategy))
    misses.sort(key=lambda miss: (-miss.qualifying, miss.node))
    return Answer(tuple(fits), tuple(misses))


def explained(
    fleet: FleetState, request: Request, misses: Iterable[NodeMiss]
) -> tuple[NodeMiss, ...]:
    """`misses` (of `where(fleet, request, explain=False)`) with their devices' reasons."""
    by_label = {node.label: node for node in fleet.nodes}
    return tuple(
        outcome
        if (node := by_label.get(miss.node)) is not None
        and isinstance(outcome := _on_node(node, request, True, fleet.taken_at), NodeMiss)
        else miss
        for miss in misses
    )


def _on_node(node: NodeState, request: Request, explain: bool, now: float) -> NodeFit | NodeMiss:
    known = node.leases is not None
    # Its GPUs read one by one, or only those its daemon would give out.
    gpus = node.snapshot if node.offered is None else node.offered
    if gpus is None or not node.up:
        age_s = node.age_at(now)
        age = "" if age_s is None else f", data {format_span(age_s)} old"
        why = node.error or "down"
        return NodeMiss(node.label, f"down: {why}{age}", leases_known=known)
    kind = kind_for(request)
    if kind.mig and not node.mig_devices_known:
        return NodeMiss(node.label, _mig_unknown(gpus), leases_known=known)
    holders = node.holders
    leases = node.leases or ()
    choice = place(kind, gpus, request, leases=leases, holders=holders, explain=explain)
    if choice.satisfied:
        return NodeFit(node.label, choice.chosen, choice.free_bytes, known)
    if node.offered is not None:
        return _given_short(node, request, choice.qualifying)
    if (hopeless := never(kind, gpus, request)) is not None:
        return NodeMiss(node.label, _never(kind, hopeless, request), choice.reasons, 0, known)
    summary = f"{choice.qualifying} of {request.count} qualify"
    return NodeMiss(node.label, summary, choice.reasons, choice.qualifying, known)


def _mig_unknown(snapshot: Snapshot) -> str:
    split = [str(gpu.index) for gpu in snapshot.gpus if gpu.mig_enabled]
    which = f"GPU {', '.join(split)} MIG-enabled" if split else "MIG devices"
    return f"MIG devices unknown: {which}, but its exporter does not tell its MIG devices"


def _given_short(node: NodeState, request: Request, qualifying: int) -> NodeMiss:
    """A node read by its daemon's verdict that gives too few GPUs: the others are in
    use, leased, busy, MIG-enabled or short of memory, by pick's rules on the node."""
    figures = node.figures
    total = figures.gpus if figures is not None else None
    if total is not None and total < request.count:
        return NodeMiss(node.label, f"never: it has {counted(total, 'GPU')}")
    others = "its other GPUs" if total is None else f"its other {total - qualifying} GPUs"
    needed = needed_bytes(request)
    short = f" or have less than {format_size(needed)} free" if needed else ""
    reason = (
        f"{others}: not given out by its daemon (in use, leased, busy, MIG-enabled, held by a "
        f"job or pod, or of unknown holders{short}; gpuwatch status there says which)"
    )
    summary = f"{qualifying} of {request.count} qualify"
    return NodeMiss(node.label, summary, (reason,), qualifying)


def _never(kind: Kind, why: Never, request: Request) -> str:
    """`never: it has 2 GPUs`, or `never: 1 GPU of 80.0GiB or more`: why waiting won't do."""
    if why.usable < request.count:
        return f"never: it has {counted(why.usable, kind.noun)}"
    return (
        f"never: {counted(why.large_enough, kind.noun)} of {format_size(why.needed_bytes)} or more"
    )


def _rank(fit: NodeFit, strategy: Strategy) -> tuple[float, str]:
    if strategy is Strategy.PACK:
        return (fit.memory_free_bytes, fit.node)
    if strategy is Strategy.LEAST_UTIL:
        return (fit.utilization_pct, fit.node)
    return (-fit.memory_free_bytes, fit.node)


def _utilization(device: Device) -> float:
    if not isinstance(device, GpuSample):
        return 0.0
    return 100.0 if device.utilization_pct is None else float(device.utilization_pct)


def nodes_named(fleet: FleetState, names: Iterable[str]) -> list[str]:
    """The names among `names` that no node of `fleet` has, by name or label (for
    `--exclude-node`)."""
    known = {node.name for node in fleet.nodes} | {node.label for node in fleet.nodes}
    return [name for name in names if name not in known]
