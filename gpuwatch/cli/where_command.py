"""`gpuwatch where`: which nodes of a fleet could run a job now, best first.

It reads the fleet once (from Prometheus, or each node's `/metrics`), only what
placement needs for the request, all within --timeout; runs `gpuwatch.placement.where`
on it (pick's rules, on every node) and prints one line per node that fits, the node's
label first (its name, escaped; `name@target` where several targets claim that name),
so that a script can take the first word of the first line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpuwatch.cli.fleet_source import open_fleet_source, source_options
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command, WholeNumber
from gpuwatch.cli.wish_options import wish_options
from gpuwatch.errors import NotEnoughGpusError
from gpuwatch.models import Device, GpuSample
from gpuwatch.placement.where import Answer, NodeFit, NodeMiss, explained, needs_of, where
from gpuwatch.request import Request, describe_wish
from gpuwatch.units import format_size

_CLOSEST_SHOWN = 3
_REASONS_SHOWN = 8


@click.command("where", cls=Command, short_help=short_help("where"))
@wish_options
@click.option(
    "--exclude-node",
    metavar="NAME",
    multiple=True,
    help="Never this node (repeatable): its name (every node claiming it) or its label.",
)
@click.option(
    "--limit",
    metavar="K",
    type=WholeNumber(1, 1_000_000),
    help="At most K nodes.  [default: all that fit]",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print a JSON list of {node, gpus, uuids, memory_free_bytes, leases_known}.",
)
@source_options
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Say on stderr where leases are unknown and which nodes are down.",
)
def where_command(
    exclude_node: tuple[str, ...],
    limit: int | None,
    as_json: bool,
    verbose: bool,
    asked: Request,
    **options: Any,
) -> int:
    """Which nodes of the fleet could run a job now: pick's rules (idle GPUs unless
    --mem or --allow-busy; leases; MIG; never a GPU a Kubernetes pod holds) run on
    every node's latest data. One line per node that fits, best first: the node,
    the GPUs it would give (nvidia-smi indices) and their free memory. A node is a
    scrape target: where two claim one name, each is NAME@TARGET.

    Examples:
      gpuwatch where -n 2 --min-free 40GiB
      node=$(gpuwatch where -n 2 --min-free 40GiB --limit 1) && ssh "${node%% *}"
      gpuwatch where --mem 10GiB --strategy pack --limit 3
      gpuwatch where --mig 1g.10gb --json
      gpuwatch where --prometheus http://prom:9090 --exclude-node gpu-07

    A node that is down, or whose data is stale, never fits; nor does a GPU of
    unknown free memory. Leases are known only on nodes that run the gpuwatch
    daemon (-v says which do not, and why each node that is down is).

    Exit status: 0 some node fits; 2 bad usage; 4 no node fits (why, for the
    closest ones, on stderr); 6 the fleet source cannot be read.
    """
    request = asked
    with open_fleet_source(options, needs=needs_of(request, errors=verbose)) as source:
        fleet = source.read()
    # Reasons only where they are shown: the closest misses, when nothing fits.
    answer = where(fleet, request, excluded_nodes=frozenset(exclude_node), explain=False)
    if verbose:
        _explain(answer)
    fits = answer.fits[:limit]
    if as_json:
        _print_json(fits)
    else:
        sys.stdout.writelines(f"{_line(fit)}\n" for fit in fits)
    if not fits:
        shown = explained(fleet, request, answer.misses[:_CLOSEST_SHOWN])
        raise NotEnoughGpusError(
            f"no node can run {describe_wish(request)} now ({_counted_nodes(answer)})",
            _closest(shown, len(answer.misses)),
        )
    return 0


def _line(fit: NodeFit) -> str:
    """`gpu-07 GPUs 2,5 (79.1GiB, 79.3GiB free)`: the node's name is the first word."""
    names = ",".join(_name(device) for device in fit.devices)
    noun = "GPU" if isinstance(fit.devices[0], GpuSample) else "MIG"
    plural = "s" if len(fit.devices) > 1 and noun == "GPU" else ""
    free = ", ".join(format_size(size) for size in fit.free_bytes)
    return f"{fit.node} {noun}{plural} {names} ({free} free)"


def _name(device: Device) -> str:
    """`3` for a GPU, `0:2` for a MIG device; `2:gi3` for one known by its GPU instance
    alone (dcgm-exporter tells no MIG device's UUID or index)."""
    if isinstance(device, GpuSample):
        return str(device.index)
    if device.uuid is None and device.gpu_instance_id is not None:
        return f"{device.gpu_index}:gi{device.gpu_instance_id}"
    return device.label


def _print_json(fits: tuple[NodeFit, ...]) -> None:
    document: list[dict[str, Any]] = [
        {
            "node": fit.node,
            "gpus": [
                device.index if isinstance(device, GpuSample) else _name(device)
                for device in fit.devices
            ],
            "uuids": [device.uuid for device in fit.devices],
            "memory_free_bytes": list(fit.free_bytes),
            "leases_known": fit.leases_known,
        }
        for fit in fits
    ]
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def _closest(misses: tuple[NodeMiss, ...], count: int) -> tuple[str, ...]:
    """The closest nodes' reasons (`misses`, of `count`), as pick gives its GPUs': a line
    each, indented below."""
    lines: list[str] = []
    for miss in misses:
        lines.append(f"{miss.node}: {miss.summary}")
        lines += [f"  {reason}" for reason in miss.reasons[:_REASONS_SHOWN]]
        if len(miss.reasons) > _REASONS_SHOWN:
            lines.append(f"  ... and {len(miss.reasons) - _REASONS_SHOWN} more")
    if count > len(misses):
        lines.append(f"... and {count - len(misses)} more nodes (-v lists them)")
    return tuple(lines)


def _counted_nodes(answer: Answer) -> str:
    down = sum(1 for miss in answer.misses if miss.summary.startswith("down"))
    total = len(answer.fits) + len(answer.misses)
    return f"{total} node{'s' if total != 1 else ''}, {down} down"


def _explain(answer: Answer) -> None:
    for fit in answer.fits:
        if not fit.leases_known:
            _say(f"{fit.node}: leases unknown (it does not run the gpuwatch daemon)")
    for miss in answer.misses:
        _say(f"{miss.node}: {miss.summary}")


def _say(message: str) -> None:
    sys.stderr.write(f"gpuwatch: {message}\n")
