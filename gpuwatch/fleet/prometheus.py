"""A fleet read from a Prometheus server: six instant queries a refresh, whatever the
number of nodes, sent at once.

    whole    identity series with all their labels (`gpuwatch_gpu_info`,
             `DCGM_FI_DEV_FB_FREE`, `nvidia_smi_gpu_info`, MIG devices, processes), and
             gpuwatch's lease counts where not 0
    indexed  the other gpuwatch and DCGM values, labelled by `gpu` only (`max by`): the
             identity labels are not sent again with every value
    by_uuid  nvidia_gpu_exporter's values, labelled by `uuid` only
    names    per target (job, instance) seen with GPU series in the last hour: its
             hostname labels, so that a node that went down keeps its name
    up       `up` of those targets
    seen     `timestamp(up)` of those targets: when each was last scraped

Prometheus answers an instant query with its evaluation time, not each sample's own
time, so the age of a node's data is `timestamp(up)` (and, for a gpuwatch daemon, the
snapshot time it exports). A target whose scrape fails has `up == 0` and its series
vanish (Prometheus marks them stale), so it shows as down under its last name, with
the age of its last snapshot. Bytes grow with nodes and GPUs, never with history.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatch.fleet import node_history, series_dcgm, series_gpuwatch, series_smi
from gpuwatch.fleet.exposition import Sample
from gpuwatch.fleet.fetch import HttpOptions
from gpuwatch.fleet.nodes import FleetState, NodeState
from gpuwatch.fleet.promapi import DEFAULT_MAX_BYTES, Point, PromClient
from gpuwatch.fleet.series import host_of, merged, node_name, safe_name, target_state
from gpuwatch.gpu_history import GpuSeries

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_STALE_AFTER_S = 120.0
"""Two scrapes at Prometheus's default interval (1m), so that a node is stale only when
a scrape was missed, whatever interval the server uses up to that."""
KNOWN_WINDOW = "1h"
_IDENTITY = ("gpuwatch_sample_timestamp_seconds", "DCGM_FI_DEV_FB_FREE", "nvidia_smi_gpu_info")
Target = tuple[str, str]
"""(job, instance): one scraped endpoint."""


def _known(by: str) -> str:
    """Targets with GPU series in the last hour; the value is a gpuwatch daemon's last
    snapshot time, 0 for other exporters (whose series carry no time of their own)."""
    return " or ".join(
        f"max by ({by}) (last_over_time({name}[{KNOWN_WINDOW}]))"
        + ("" if name.startswith("gpuwatch_") else " * 0")
        for name in _IDENTITY
    )


@dataclass(frozen=True, slots=True)
class ValueQuery:
    """Current values of some families: with only the labels in `keep` (and `__name__`,
    `job`, `instance`) where identity rides on other series, else with all their labels;
    `filtered` families only where their value passes a comparison (`== 0`, `> 0`): most
    GPUs are up, hold no lease and are not split, and what is absent is not sent.

    PromQL's `or` keeps one of two series whose labels differ only by name, so each filter
    is one selector, and the ones after it lose a series only on a GPU an earlier one
    already kept (a GPU that is down, whose leases and MIG mode no longer matter)."""

    families: tuple[str, ...]
    keep: tuple[str, ...] | None = None
    filtered: tuple[tuple[tuple[str, ...], str, float], ...] = ()

    def promql(self) -> str:
        selector = _selector(self.families)
        if self.keep is not None:
            return f"max by (__name__, job, instance, {', '.join(self.keep)}) ({selector})"
        filters = [f"{_selector(names)} {op} {value:g}" for names, op, value in self.filtered]
        return " or ".join([selector, *filters])


def _selector(names: tuple[str, ...]) -> str:
    return '{__name__=~"' + "|".join(names) + '"}'


VALUE_QUERIES = {
    "whole": ValueQuery(
        (*series_gpuwatch.WHOLE, *series_dcgm.WHOLE, *series_smi.WHOLE),
        filtered=((series_gpuwatch.ZERO, "==", 0), (series_gpuwatch.NONZERO, ">", 0)),
    ),
    "indexed": ValueQuery(
        (*series_gpuwatch.INDEXED, *series_dcgm.INDEXED),
        ("gpu", "GPU_I_ID", *series_gpuwatch.INDEXED_LABELS),
    ),
    "by_uuid": ValueQuery(series_smi.BY_UUID, ("uuid",)),
}
QUERIES = {
    **{kind: query.promql() for kind, query in VALUE_QUERIES.items()},
    "names": _known("job, instance, hostname, Hostname"),
    "up": f"up and on (job, instance) ({_known('job, instance')})",
    "seen": f"timestamp(up) and on (job, instance) ({_known('job, instance')})",
}
"""The instant queries of one refresh; their number does not depend on the fleet's size."""


class PrometheusSource:
    """A fleet as a Prometheus server (or Thanos, VictoriaMetrics, Mimir) sees it.

    >>> PrometheusSource("http://prometheus:9090").description
    'prometheus http://prometheus:9090'
    """

    def __init__(
        self,
        url: str,
        *,
        options: HttpOptions | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = PromClient(
            url, options=options or HttpOptions(), timeout_s=timeout_s, max_bytes=max_bytes
        )
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._targets: dict[str, Target] = {}
        self._uuids: dict[str, dict[str, int]] = {}
        self._last: dict[Target, float] = {}

    @property
    def description(self) -> str:
        return f"prometheus {self.client.url}"

    @property
    def queries_per_read(self) -> int:
        """How many queries one `read()` sends: the same for 1 node or 10,000."""
        return len(QUERIES)

    def read(self) -> FleetState:
        """The fleet now; raises `SourceError` when the server cannot be read."""
        answers = self.client.query(list(QUERIES.values()))
        results = dict(zip(QUERIES, answers, strict=True))
        now = max((evaluated for evaluated, _ in answers), default=0.0) or self._clock()
        samples = _by_target([p for kind in VALUE_QUERIES for p in results[kind][1]])
        names = _names(results["names"][1])
        last = {_target(p.labels): p.values[0][1] for p in results["names"][1]}
        up = {_target(p.labels): p.values[0][1] for p in results["up"][1]}
        seen = {_target(p.labels): p.values[0][1] for p in results["seen"][1]}
        self._last = last
        states = {
            target: self._state(
                target,
                names.get(target) or host_of(target[1]),
                samples.get(target, []),
                up,
                seen,
                now,
            )
            for target in sorted(set(samples) | set(up))
        }
        nodes = merged(states.values())
        self._remember(states, nodes)
        return FleetState(taken_at=now, source=self.description, nodes=nodes)

    def _state(
        self,
        target: Target,
        name: str | None,
        samples: list[Sample],
        up: dict[Target, float],
        seen: dict[Target, float],
        now: float,
    ) -> NodeState:
        seen_at = seen.get(target, now)
        if up.get(target, 1) != 1 or not samples:
            # Its series are gone with the failed scrape: only a daemon's last snapshot
            # time (kept by the names query) says how old its data is.
            last = self._last.get(target, 0.0)
            age_s = max(0.0, now - last) if last > 0 else None
            where = f"{safe_name(target[1])} (job {safe_name(target[0])})"
            why = (
                f"Prometheus cannot scrape {where}"
                if up.get(target, 1) != 1
                else f"{where} sends Prometheus no GPU series now"
            )
            shown = safe_name(name or target[1])
            return NodeState(shown, up=False, snapshot=None, age_s=age_s, error=why)
        return target_state(
            samples,
            fallback_name=name or host_of(target[1]),
            seen_at=seen_at,
            now=now,
            stale_after_s=self.stale_after_s,
        )

    def _remember(self, states: dict[Target, NodeState], nodes: tuple[NodeState, ...]) -> None:
        """Which target a node name stands for, and its GPUs' indices, for `history`."""
        winners = {node.name: node for node in nodes}
        self._targets = {}
        for target, state in states.items():
            if winners.get(state.name) is state:
                self._targets[state.name] = target
        self._uuids = {
            node.name: {gpu.uuid: gpu.index for gpu in node.snapshot.gpus if gpu.uuid}
            for node in nodes
            if node.snapshot is not None
        }

    def history(
        self, node: str, *, duration_s: float = 600.0, points: int = 240
    ) -> tuple[GpuSeries, ...]:
        """The node's GPUs over the last `duration_s`: memory used, utilization,
        temperature and power, `points` samples each (one `query_range`); empty for a
        node the last `read()` did not see."""
        if (target := self._targets.get(node)) is None:
            return ()
        end = self._clock()
        step_s = max(1.0, duration_s / points)
        query = node_history.query(*target)
        matrix = self.client.query_range(query, end - duration_s, end, step_s)
        return node_history.series(matrix, self._uuids.get(node, {}))

    def close(self) -> None:
        """Nothing stays open between reads."""


def _target(labels: dict[str, str]) -> Target:
    return (labels.get("job", ""), labels.get("instance", ""))


def _by_target(points: list[Point]) -> dict[Target, list[Sample]]:
    samples: dict[Target, list[Sample]] = defaultdict(list)
    for point in points:
        labels = point.labels
        name = labels.get("__name__", "")
        samples[_target(labels)].append(Sample(name, labels, point.values[0][1]))
    return samples


def _names(points: list[Point]) -> dict[Target, str]:
    names: dict[Target, str] = {}
    for point in points:
        found = node_name([Sample("", point.labels, 0.0)])
        if found:
            names.setdefault(_target(point.labels), found)
    return names
