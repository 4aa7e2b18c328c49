"""`gpuwatch status`: the GPUs now, as a table or JSON, once or every few seconds."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable

import click

from gpuwatch.backends import open_backend
from gpuwatch.cli.options import Duration, backend_options
from gpuwatch.leases import LeaseDir
from gpuwatch.models import Lease, Snapshot
from gpuwatch.sampling import watch

_CLEAR_SCREEN = "\x1b[H\x1b[2J"


@click.command()
@backend_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the snapshot's fields, with `gpus` and `processes` lists.",
)
@click.option(
    "--watch",
    "interval_s",
    type=Duration(minimum_s=0.05),
    metavar="SECONDS",
    help="Sample again every SECONDS (e.g. 1, 500ms): redraw the table, or with "
    "--json print one JSON object per line (NDJSON).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    help="With --watch, stop after COUNT samples.  [default: run until Ctrl-C]",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour the table; auto colours a terminal unless NO_COLOR is set.",
)
def status(
    backend: str | None,
    sim: str | None,
    as_json: bool,
    interval_s: float | None,
    count: int | None,
    color: str,
) -> None:
    """Show every GPU with its memory, load, temperature, power, processes and leases.

    \b
    Examples:
      gpuwatch status                         # a table, like gpustat
      gpuwatch status --sim 4                 # a simulated 4-GPU node
      gpuwatch status --json | jq '.gpus[] | {index, memory_free_bytes}'
      gpuwatch status --watch 2               # redraw every 2 seconds
      gpuwatch status --json --watch 1 >> gpus.ndjson
    """
    if count is not None and interval_s is None:
        raise click.UsageError("--count needs --watch")
    show = _print_json if as_json else _table_printer(color)
    lease_dir = LeaseDir.read_only()
    with open_backend(backend, sim) as source:
        if interval_s is None:
            show(source.sample(), _leases(lease_dir), pretty=True)
            return
        for number, snapshot in enumerate(watch(source, interval_s, count=count)):
            if number and not as_json:
                sys.stdout.write(_CLEAR_SCREEN if sys.stdout.isatty() else "\n")
            show(snapshot, _leases(lease_dir), pretty=False)


def _leases(lease_dir: LeaseDir | None) -> list[Lease]:
    return lease_dir.leases() if lease_dir is not None else []


def _print_json(snapshot: Snapshot, leases: list[Lease], *, pretty: bool) -> None:
    data = {**snapshot.to_dict(), "leases": [lease.to_dict() for lease in leases]}
    sys.stdout.write(json.dumps(data, indent=2 if pretty else None) + "\n")
    sys.stdout.flush()


def _table_printer(color: str) -> Callable[..., None]:
    from gpuwatch.cli.table import Style, render

    if color == "auto":
        use_color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    else:
        use_color = color == "always"
    encoding = (sys.stdout.encoding or "").lower().replace("-", "")
    style = Style(color=use_color, unicode=encoding == "utf8")

    def print_table(snapshot: Snapshot, leases: list[Lease], *, pretty: bool) -> None:
        width = shutil.get_terminal_size().columns
        sys.stdout.write(render(snapshot, leases=leases, style=style, width=width))
        sys.stdout.flush()

    return print_table
