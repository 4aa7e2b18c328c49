"""`gpuwatch fleet`: opens the fleet source its options name and hands it to the fleet
screen, or prints one read of it (`--once`, `--json`).

The source options are `gpuwatch where`'s (`gpuwatch.cli.fleet_source`): the same
names, checks and resolution (`--sim N`, `--prometheus`, `--node`, `--nodes-file`,
else `GPUWATCH_PROMETHEUS` or fleet.toml).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

import click

from gpuwatch.cli.fleet_source import open_fleet_source, source_options
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command, Duration
from gpuwatch.cli.terminal import terminal_columns
from gpuwatch.fleet.document import document_text
from gpuwatch.fleet.source import IDLE_AFTER_S, FleetSource, Needs
from gpuwatch.fleet_model import NodeState
from gpuwatch.text import printable
from gpuwatch.tui.fleet.cells import plain_table
from gpuwatch.tui.fleet.model import FleetView
from gpuwatch.tui.fleet.rows import build_rows, totals


@click.command(cls=Command, short_help=short_help("fleet"))
@click.option("--once", is_flag=True, help="Print the table once and exit.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document and exit: taken_at, source, and each node's state and "
    "GPUs, with null for what its exporter does not tell.",
)
@click.option(
    "--interval",
    "interval_s",
    type=Duration(minimum_s=0.5, maximum_s=3600.0),
    metavar="SECONDS",
    help="Read the fleet every SECONDS (e.g. 2, 10s; 500ms to 1h).  [default: 2s]",
)
@click.option(
    "--idle-after",
    "idle_after_s",
    type=Duration(minimum_s=0, maximum_s=7 * 86400.0),
    metavar="DURATION",
    help="Count a held GPU (leased, or a process holds memory) as an idle holder once it "
    "has been idle this long: as the screen saw it, or as Prometheus did for gpuwatch "
    "daemons (then at least 1m); up to 7d; --once elsewhere: idle now.  [default: 10m]",
)
@source_options
def fleet(
    once: bool,
    as_json: bool,
    interval_s: float | None,
    idle_after_s: float | None,
    **source_options: Any,
) -> int:
    """Every node's GPUs on one screen: free GPUs, memory, load, leases and jobs.

    A GPU is free when a plain `gpuwatch pick` would take it: no lease, no other
    job's process, at most 1 GiB used and 5% busy, on a node whose data is current.
    Enter shows a node's GPUs, u the users across the fleet, ? every key.

    \b
    Examples:
      gpuwatch fleet --sim 20             # a simulated fleet of 20 nodes
      gpuwatch fleet --sim 20 --once      # the table, printed once
      gpuwatch fleet --prometheus http://prom:9090
      gpuwatch fleet --node gpu-01 --node gpu-02:9400 --interval 5
      gpuwatch fleet --json | jq '.nodes[] | select(.up) | .node'
    """
    if interval_s is not None and (once or as_json):
        raise click.UsageError(
            "--interval sets the live screen's refresh: not with --once or --json"
        )
    # The table needs each node's figures; the document, every GPU.
    idle = IDLE_AFTER_S if idle_after_s is None else idle_after_s
    needs = Needs(per_node=not as_json, idle_after_s=idle)
    opened = open_fleet_source(source_options, needs=needs, whole_command=once or as_json)
    if as_json:
        with opened as source:  # within --timeout: the reads and the document's text
            text = document_text(source.read())
        sys.stdout.writelines(text)  # at the reader's pace
        return 0
    with opened as source:
        if once:
            return print_table(source)
        return run_screen(source, interval_s, idle_after_s)


def print_table(source: FleetSource) -> int:
    state = source.read()
    rows = build_rows(state)
    width = max(80, terminal_columns()) if sys.stdout.isatty() else 80
    lines = plain_table(FleetView().arrange(rows), totals(rows), width, state.taken_at)
    lines += [_why_not_up(node) for node in state.nodes if not node.up]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _why_not_up(node: NodeState) -> str:
    """`gpu-07: down: HTTP 401: ...`: a line below the table for a node that is not up."""
    why = node.error or "no reason given"
    state = "" if why.startswith("stale") or node.figures is not None else "down: "
    return f"{printable(node.label)}: {state}{why}"


def run_screen(source: FleetSource, interval_s: float | None, idle_after_s: float | None) -> int:
    # Here: textual, which --once and --json do without.
    from gpuwatch.tui.common.app import DEFAULT_IDLE_AFTER_S
    from gpuwatch.tui.fleet.app import DEFAULT_INTERVAL_S, FleetApp

    first = source.read()  # a source that cannot be read at all: one line, before the screen
    collect_garbage_rarely()
    app = FleetApp(
        source,
        first=first,
        interval_s=DEFAULT_INTERVAL_S if interval_s is None else interval_s,
        idle_after_s=DEFAULT_IDLE_AFTER_S if idle_after_s is None else idle_after_s,
    )
    app.run()
    return app.return_code or 0


SCREEN_GC_THRESHOLDS = (20_000, 50, 100)
"""Each read of a large fleet makes tens of thousands of small objects (decoded JSON,
samples, rows), nearly all freed by their counts at the next read. At Python's default
thresholds (700, 10, 10) the cycle collector ran dozens of times a read and every few
reads went through all of the screen's objects: about a third of its CPU at 500 nodes
(bench/fleet_cost.py). At these it runs a few times a minute."""


def collect_garbage_rarely() -> None:
    """Sets this process's cycle collector to run rarely: the screen's own objects make
    few cycles, and the young ones are freed by their counts."""
    gc.set_threshold(*SCREEN_GC_THRESHOLDS)
