"""The click definition of `gpuwatch status`: its help, and the wording of its usage errors.

A plain `gpuwatch status` is read without click (gpuwatch.cli.status): this
definition serves `--help`, every mistake in the options, and callers that go
through the click group, so that help and errors are click's, as for every
other command.
"""

from __future__ import annotations

import click

from gpuwatch.cli.options import Command, Duration, HostName, WholeNumber, backend_options
from gpuwatch.cli.status import COLORS, MAX_COUNT, MAX_WATCH_S, MIN_WATCH_S, show_status


@click.command(cls=Command)
@backend_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the snapshot's fields, with `gpus`, `processes` and `leases`, and "
    "`jobs` (on a Slurm node; each GPU's `job_id`).",
)
@click.option(
    "--watch",
    "interval_s",
    type=Duration(minimum_s=MIN_WATCH_S, maximum_s=MAX_WATCH_S),
    metavar="SECONDS",
    help="Sample again every SECONDS (e.g. 1, 500ms; 50ms to 24h): redraw the table, or "
    "with --json print one JSON object per line (NDJSON).",
)
@click.option(
    "--count",
    type=WholeNumber(1, MAX_COUNT),
    metavar="N",
    help="With --watch, stop after N samples.  [default: run until Ctrl-C]",
)
@click.option(
    "--host",
    metavar="[USER@]HOST",
    type=HostName(),
    help="Show another machine's GPUs, read over ssh (gpuwatch must be installed "
    "there); --backend and --sim apply on that machine.",
)
@click.option(
    "--color",
    type=click.Choice(COLORS),
    default="auto",
    show_default=True,
    help="Colour the table; auto colours a terminal unless NO_COLOR is set.",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Say where the GPUs were read from (the daemon, or the driver and why), and how "
    "many malformed lease files were skipped.",
)
@click.option(
    "--no-jobs",
    is_flag=True,
    help="Do not ask the daemon or Slurm which job holds each GPU (shown on a Slurm node, "
    "under each GPU; in JSON as `jobs` and each GPU's `job_id`).",
)
def status(
    backend: str | None,
    sim: str | None,
    as_json: bool,
    interval_s: float | None,
    count: int | None,
    host: str | None,
    color: str,
    verbose: bool,
    no_jobs: bool,
) -> int:
    """Show every GPU with its memory, load, temperature, power, processes and leases.

    GPUs are read from the gpuwatch daemon when one runs, else from the driver. On a Slurm
    node, each GPU a job holds says which (id, user, name, time left).

    \b
    Examples:
      gpuwatch status                   # a table, like gpustat
      gpuwatch status --sim 4           # a simulated 4-GPU node
      gpuwatch status --json | jq '.gpus[].utilization_pct'
      gpuwatch status --watch 2         # redraw every 2 seconds
      gpuwatch status --json --watch 1 >> gpus.ndjson
      gpuwatch status --host alice@node7 --watch 2
    """
    if count is not None and interval_s is None:
        raise click.UsageError("--count needs --watch")
    return show_status(backend, sim, as_json, interval_s, count, host, color, verbose, no_jobs)
