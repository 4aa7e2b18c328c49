"""The PromQL a Prometheus source sends: one plain query per metric family, all at once.

Why one per family: Prometheus selects a series by its exact name through its index,
but a `{__name__=~"a|b|c"}` selector of families of a series per GPU, or `a or b or c`,
costs it ten to thirty times as much at 500 nodes (measured: bench/fleet_cost.py), and
`or` keeps only one of two series whose labels differ by name alone. Families of one
series per node are the exception (`NodeFamilies`): few series, and a dozen of them.
Separate queries are evaluated in parallel and the answer to each tells its family, so an
aggregated answer needs no `__name__`.

    values    the exporter's per-GPU figures, labelled by target and `gpu` only
              (`max by`): identity labels are not sent again with every value
    whole     families whose labels are their content (identity, processes, MIG)
    filtered  flags sent only where they differ from the common case (`== 0`, `> 0`)
    series    which series there are (`group by`): dcgm-exporter's GPU instances, in
              whatever family it exports them

For placement (`gpuwatch where`) the plan leaves out what the rules never read
(temperature, power, model names, bus ids, process names); at pick's default limits, a
gpuwatch daemon's own verdict on each GPU stands for its processes and leases
(`verdicts`). `gpuwatch.fleet.plan` puts a read's queries together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import msgspec

from gpuwatch.fleet import node_work, series_dcgm, series_gpuwatch, series_smi
from gpuwatch.fleet_model import Exporter

KNOWN_WINDOW = "1h"
_TARGET = ("job", "instance")


class FamilyQuery(msgspec.Struct, frozen=True):
    """One family's current values: with only the target's labels and `keep` (an
    aggregation, which drops `__name__`), else with all labels; `compare` filters
    (`== 0`, `> 0`) so that what is absent is not sent."""

    family: str
    keep: tuple[str, ...] | None = None
    compare: str = ""
    only_where: FamilyQuery | None = None
    """Another query: only the GPUs it answers are kept (joined on target and `gpu`)."""
    expression: str = ""
    """Evaluated in place of the family's own series: a recording rule's expression, where
    the server records none; `$m` in it stands where each selector takes a matcher."""

    def promql(self, matcher: str = "") -> str:
        """The query; `matcher` (`instance=~"..."`) narrows it to some targets."""
        braced = f"{{{matcher}}}" if matcher else ""
        expr = self.expression.replace("$m", braced) if self.expression else self.family + braced
        if self.keep is not None:
            expr = f"max by ({', '.join((*_TARGET, *self.keep))}) ({expr})"
        expr = f"{expr} {self.compare}" if self.compare else expr
        if self.only_where is not None:
            on = ", ".join((*_TARGET, "gpu"))
            expr = f"{expr} and on ({on}) {self.only_where.promql(matcher)}"
        return expr


class NodeFamilies(msgspec.Struct, frozen=True):
    """Families of one series per target, read in one query whose answer keeps each
    series' name (`max by (__name__, job, instance)`); `compare` filters them all alike
    (`> 0`: only where they differ from the common case). A refresh's per-node figures
    are a dozen such families: one request for them costs the client a tenth of what a
    dozen cost, and Prometheus, which matches their names against a few hundred, no more."""

    families: tuple[str, ...]
    compare: str = ""
    family: ClassVar[str] = ""
    """No one family: each sample's is its `__name__`."""

    def promql(self, matcher: str = "") -> str:
        names = f'__name__=~"{"|".join(self.families)}"'
        selector = f"{{{names}, {matcher}}}" if matcher else f"{{{names}}}"
        selector = f"{selector} {self.compare}" if self.compare else selector
        return f"max by (__name__, {', '.join(_TARGET)}) ({selector})"


class Families(msgspec.Struct, frozen=True):
    """Several families in one selector, each series keeping its name: labelled by its
    target and `keep` (`max by`), or with all its labels (`keep=None`). For the other
    exporters' few families: a fleet of them is small, and one request costs less than a
    dozen (Prometheus matches a list of names by set, as fast as each alone)."""

    families: tuple[str, ...]
    keep: tuple[str, ...] | None = ()
    family: ClassVar[str] = ""
    """No one family: each sample's is its `__name__`."""

    def promql(self, matcher: str = "") -> str:
        names = f'__name__=~"{"|".join(self.families)}"'
        selector = "{" + ", ".join(part for part in (names, matcher) if part) + "}"
        if self.keep is None:
            return selector
        return f"max by (__name__, {', '.join((*_TARGET, *self.keep))}) ({selector})"


class SeriesQuery(msgspec.Struct, frozen=True):
    """Which series there are, of any family whose series match `matchers`: one sample a
    group of `keep`, named `family` (what the series are, not their values)."""

    family: str
    matchers: str
    keep: tuple[str, ...]

    def promql(self, matcher: str = "") -> str:
        inner = ", ".join(part for part in (self.matchers, matcher) if part)
        return f"group by ({', '.join((*_TARGET, *self.keep))}) ({{{inner}}})"


Query = FamilyQuery | NodeFamilies | Families | SeriesQuery
UP_SEEN = "timestamp(up) * (2 * up - 1)"
"""Each target's last scrape time, negative where that scrape failed: `up` and
`timestamp(up)` in one answer, with every label Prometheus gives the target."""

_SAMPLING_UP = "gpuwatch_sampling_up"
_FREE = "gpuwatch_memory_free_bytes"
_TOTAL = "gpuwatch_memory_total_bytes"
IDENTITY = ("gpuwatch_gpu_info", _TOTAL)
"""gpuwatch families of a GPU's identity, which a read for placement leaves out but for
total memory (free and total memory carry each GPU's `uuid`)."""
_NOT_PLACED = frozenset(
    {
        "gpuwatch_temperature_celsius",
        "gpuwatch_power_watts",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "nvidia_smi_temperature_gpu",
        "nvidia_smi_power_draw_watts",
        node_work.WAITERS,
        node_work.LONGEST_WAIT,
        node_work.JOBS_KNOWN,
        node_work.ALLOCATED_IDLE,
        series_gpuwatch.SIMULATED,
    }
)
"""Families placement's rules never read (the line of waiting jobs, how long a job left
its GPU idle and whether a node is simulated are shown, not placed on; who holds each
device is placed on: `node_work.claims`)."""
_PLACED_LABELS = {
    "gpuwatch_gpu_info": ("gpu", "uuid"),
    "gpuwatch_process_memory_bytes": ("gpu", "pid", "kind", "user"),
}
"""For placement, the labels it reads of families otherwise read whole."""
_MIG_DEVICES = frozenset({"gpuwatch_mig_leases", *series_gpuwatch.MIG_VALUES})
DCGM_DEVICES = SeriesQuery(
    series_dcgm.DEVICES,
    f'__name__=~"{"|".join(series_dcgm.SEEN)}"',
    (*series_dcgm.DEVICE_LABELS, *series_dcgm.POD_LABELS),
)
"""dcgm-exporter's GPUs and GPU instances, in the families it exports them in (2.x: no
memory family of a GPU instance), with their identity, host and the pods that hold them:
a series of a GPU instance is what makes a GPU MIG-enabled. Names listed, not a pattern:
Prometheus matches a list by set, `DCGM_FI_.+` name by name (five times the cost)."""


def gpuwatch_values(*, placement: bool, mig: bool = True) -> list[FamilyQuery]:
    """gpuwatch's families of a read GPU by GPU, identity included (`placement`: the
    families placement's rules read, each GPU's `uuid` on its free and total memory, MIG
    devices' only where `mig`)."""
    queries = [_indexed(name) for name in series_gpuwatch.INDEXED]
    queries += [FamilyQuery(name, _keep(name, placement)) for name in series_gpuwatch.WHOLE]
    queries += [FamilyQuery(name, compare="== 0") for name in series_gpuwatch.ZERO]
    queries += [FamilyQuery(name, compare="> 0") for name in series_gpuwatch.NONZERO]
    queries = [q for q in queries if q.family not in IDENTITY]
    if not placement:
        return [*queries, FamilyQuery("gpuwatch_gpu_info"), FamilyQuery(_TOTAL, ("gpu",))]
    queries = [
        FamilyQuery(_FREE, ("gpu", "uuid")) if q.family == _FREE else q
        for q in queries
        if q.family not in _NOT_PLACED and (mig or q.family not in _MIG_DEVICES)
    ]
    return [*queries, FamilyQuery(_TOTAL, ("gpu", "uuid"))]


def _indexed(name: str) -> FamilyQuery:
    if name == _SAMPLING_UP:  # one per node, and 1 on all but a failing daemon
        return FamilyQuery(name, compare="== 0")
    if name == node_work.JOB_INFO:  # its labels are its content: which job, whose
        return FamilyQuery(name, ("gpu", *series_gpuwatch.INDEXED_LABELS))
    return FamilyQuery(name, ("gpu",))


def _keep(name: str, placement: bool) -> tuple[str, ...] | None:
    return _PLACED_LABELS.get(name) if placement else None


def dcgm_values(*, placement: bool) -> list[Query]:
    """dcgm-exporter's families: values by GPU (and GPU instance), in one query, and its
    devices with their labels (identity, host, pods)."""
    names = [name for name in series_dcgm.INDEXED if not (placement and name in _NOT_PLACED)]
    return [Families(tuple(names), ("gpu", "GPU_I_ID")), DCGM_DEVICES]


def smi_values(*, placement: bool) -> list[Query]:
    """nvidia_gpu_exporter's families, in one query: each series with its labels (values
    carry only `uuid`; identity, processes and MIG devices are their labels)."""
    names = [name for name in series_smi.FAMILIES if not (placement and name in _NOT_PLACED)]
    return [Families(tuple(names), None)]


AVAILABLE_BYTES = series_gpuwatch.AVAILABLE
AVAILABLE_GPUS = "gpuwatch_gpus_available"
NODE_GPUS = "gpuwatch_node_gpus"


def verdicts(free_bytes: int, idle_ratio: float) -> list[Query]:
    """What `where` reads of a gpuwatch daemon for a request judged as the default one
    (`Request.judged_as_default`): the GPUs it would give out with at least `free_bytes`
    free (their available memory, which is their free memory, and `uuid`), its count of
    such GPUs (a daemon older than these series tells none: its node must be read GPU by
    GPU) and of all its GPUs, its snapshot time and failed sampling. Utilization ranks
    GPUs of equal free memory; it is read only up to `idle_ratio` (the default limit): a
    GPU given out is never busier."""
    node = (AVAILABLE_GPUS, NODE_GPUS, "gpuwatch_sample_timestamp_seconds")
    return [
        FamilyQuery(AVAILABLE_BYTES, ("gpu", "uuid"), f">= {max(1, free_bytes)}"),
        FamilyQuery("gpuwatch_utilization_ratio", ("gpu",), f"<= {idle_ratio!r}"),
        NodeFamilies(node),
        FamilyQuery(_SAMPLING_UP, compare="== 0"),
    ]


_KNOWN = {
    Exporter.GPUWATCH: "gpuwatch_sample_timestamp_seconds",
    Exporter.DCGM: "DCGM_FI_DEV_FB_FREE",
    Exporter.NVIDIA_GPU_EXPORTER: "nvidia_smi_gpu_info",
}


def names() -> str:
    """Per target with GPU series in the last hour: its hostname labels and, in label
    `exporter`, which exporter it runs; the value is a gpuwatch daemon's last snapshot
    time, 0 for other exporters (whose series carry no time of their own). A node that
    went down keeps its name and the age of its data, and its job counts as one of GPU
    nodes, whose every target is a node, up or not."""
    by = "job, instance, hostname, Hostname"
    return " or ".join(
        f"label_replace(max by ({by}) (last_over_time({name}[{KNOWN_WINDOW}]))"
        + ("" if exporter is Exporter.GPUWATCH else " * 0")
        + f', "exporter", "{exporter.value}", "", "")'
        for exporter, name in _KNOWN.items()
    )


STORED_WITHIN_S = 0.25
"""How long after a scrape ends its series are stored, at the most: a scrape that ended
that long before a read's evaluation time was in it."""
ROUND_BEHIND_S = 1.0
"""How long before it is sent a read is evaluated (every query of it at that one instant):
a scrape that started before then has been stored, at a scrape's duration under it, so
that no scrape stored while the read's queries run changes their answers. Else each
query is evaluated at its own arrival, and a node scraped between two of them is up in
one answer and missing, or in part, from another."""


def scraped_since(query: str, since: float) -> str:
    """`query` for the targets scraped since `since` only (an earlier read's evaluation
    time): those whose last scrape ended after it (less `STORED_WITHIN_S`), so that a
    scrape still running then is read now; its series carry its start time. Prometheus
    selects them; the answer holds only theirs."""
    scraped = "timestamp(up) + scrape_duration_seconds"
    return f"({query}) and on (job, instance) ({scraped} > {since - STORED_WITHIN_S:.3f})"


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_LITERAL = str.maketrans({char: f"\\{char}" for char in _REGEX_SPECIAL})


def instances(names: Iterable[str]) -> str:
    """A selector's matcher for the targets whose `instance` is one of `names`, e.g.
    `instance=~"gpu-01:9400|gpu-02:9400"`: Prometheus finds them in its index, so a
    query narrowed so reads only their series. Each name is matched literally."""
    pattern = "|".join(map(_literal, sorted(set(names))))
    return 'instance=~"' + pattern.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _literal(name: str) -> str:
    """`name` as a regular expression that matches it; a control character (which a
    PromQL string cannot hold as it is) as any character: a target more is read, none
    less."""
    if name.isprintable():
        return name.translate(_LITERAL)
    return "".join("." if not char.isprintable() else char.translate(_LITERAL) for char in name)
