"""`gpuwatch status`: the GPUs now, as a table or JSON, once or every few seconds."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator

import click

from gpuwatch.backends import open_backend, remote_snapshots
from gpuwatch.backends.base import Backend
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import (
    HOST,
    Command,
    Duration,
    WholeNumber,
    backend_options,
    no_jobs_option,
)
from gpuwatch.cli.status_jobs import with_jobs
from gpuwatch.cli.table import Style, render
from gpuwatch.cli.terminal import terminal_columns
from gpuwatch.jobs.job_table import NodeJobs
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import Lease, Snapshot
from gpuwatch.sampling.node_jobs import JobsReader, early_reader, jobs_reader, scheduler_here
from gpuwatch.sampling.ticks import watch
from gpuwatch.text import printable

_CLEAR_SCREEN = "\x1b[H\x1b[2J"
MIN_WATCH_S = 0.05
MAX_WATCH_S = 86400.0
MAX_COUNT = 1_000_000_000
COLORS = ("auto", "always", "never")


@click.command(cls=Command, short_help=short_help("status"))
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
    type=HOST,
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
    "--header/--no-header",
    default=None,
    help="A line naming the table's columns.  [default: on a terminal]",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Say where the GPUs were read from (the daemon, or the driver and why), and how "
    "many malformed lease files were skipped.",
)
@no_jobs_option("shown on a Slurm node, under each GPU; in JSON as `jobs` and each GPU's `job_id`")
def status(
    backend: str | None,
    sim: str | None,
    as_json: bool,
    interval_s: float | None,
    count: int | None,
    host: str | None,
    color: str,
    header: bool | None,
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
    if as_json and header:
        raise click.UsageError("--header names the table's columns: JSON has none")
    show = _print_json if as_json else _table_printer(color, header)
    if host is not None:
        frames = _remote_frames(host, backend, sim, interval_s, count, verbose)
    else:
        frames = _local_frames(backend, sim, interval_s, count, verbose, not no_jobs)
    for number, (snapshot, leases, node_jobs) in enumerate(frames):
        if number and not as_json:
            sys.stdout.write(_CLEAR_SCREEN if sys.stdout.isatty() else "\n")
        show(snapshot, leases, node_jobs, pretty=interval_s is None)
    return ExitCode.OK


def _remote_frames(
    host: str,
    backend: str | None,
    sim: str | None,
    interval_s: float | None,
    count: int | None,
    verbose: bool,
) -> Iterator[tuple[Snapshot, list[Lease], NodeJobs | None]]:
    if verbose:
        _say(f"reading GPUs of {host} over ssh (gpuwatch status there)")
    remote = remote_snapshots(
        host,
        interval_s=interval_s or 1.0,
        count=count if interval_s else 1,
        backend=backend,
        sim=sim,
    )
    return ((snapshot, leases, None) for snapshot, leases in remote)


def _local_frames(
    backend: str | None,
    sim: str | None,
    interval_s: float | None,
    count: int | None,
    verbose: bool,
    jobs: bool,
) -> Iterator[tuple[Snapshot, list[Lease], NodeJobs | None]]:
    say = _say if verbose else None
    early = _early_jobs(interval_s is None and jobs)
    with open_backend(backend, sim, on_fallback=say, on_lost=_say) as source:
        if say is not None:
            say(f"reading GPUs from {_described(source)}")
        lease_dir = LeaseDir.read_only(on_refused=say, simulation=source.simulation)
        reader = _jobs_reader(source, interval_s is None, jobs, early)
        try:
            if reader is not None:
                reader.start()  # the engine answers while the GPUs are read (if not already)
            if interval_s is None:
                snapshot = source.sample()
                yield snapshot, _leases(lease_dir, say), _read_jobs(reader, snapshot)
                return
            lost = _LostDaemon(interval_s)
            for snapshot in watch(source, interval_s, count=count, on_unavailable=lost.tell):
                lost.back()
                yield snapshot, _leases(lease_dir, say), _read_jobs(reader, snapshot)
        finally:
            if reader is not None:
                reader.close()


def _early_jobs(one_shot: bool) -> JobsReader | None:
    """This node's job reader, asked before the driver opens (see `early_reader`); `None`
    where no job engine is."""
    if not one_shot:
        return None
    return early_reader() if scheduler_here() else None


def _jobs_reader(
    source: Backend, one_shot: bool, wanted: bool, early: JobsReader | None
) -> JobsReader | None:
    """Who to ask for the jobs on `source`'s GPUs: `None` where no scheduler could answer
    (no daemon to ask, no Slurm)."""
    if not wanted:
        return None
    if getattr(source, "socket_path", None) is None and not scheduler_here():
        return None
    return jobs_reader(source, one_shot=one_shot, local=early)


def _read_jobs(reader: JobsReader | None, snapshot: Snapshot) -> NodeJobs | None:
    if reader is None:
        return None
    reader.observe(snapshot)  # an engine may need them to tell which GPU is which
    return reader.read()


class _LostDaemon:
    """What a watch says when the daemon goes away: one line, and no more until the daemon
    has answered again for a while (a daemon shutting down may answer once more)."""

    def __init__(self, interval_s: float, quiet_s: float = 10.0) -> None:
        self._interval_s = interval_s
        self._quiet_s = quiet_s
        self._failed_at: float | None = None

    def tell(self, error: Exception) -> None:
        if self._failed_at is None:
            _say(f"lost the daemon ({error}); trying again every {self._interval_s:g}s")
        self._failed_at = time.monotonic()

    def back(self) -> None:
        if self._failed_at is not None and time.monotonic() - self._failed_at > self._quiet_s:
            self._failed_at = None


def _described(source: Backend) -> str:
    path = getattr(source, "socket_path", None)
    return f"the daemon at {path}" if path else f"the {source.name} backend"


def _say(message: str) -> None:
    sys.stderr.write(printable(f"gpuwatch: {message}") + "\n")
    sys.stderr.flush()


def _leases(lease_dir: LeaseDir | None, say: Callable[[str], None] | None) -> list[Lease]:
    if lease_dir is None:
        return []
    found = lease_dir.read()
    if found.skipped and say is not None:
        say(f"skipped {found.skipped} malformed file(s) in the lease directory {lease_dir.path}")
    return found.leases


def _print_json(
    snapshot: Snapshot, leases: list[Lease], jobs: NodeJobs | None, *, pretty: bool
) -> None:
    data = {**snapshot.to_dict(), "leases": [lease.to_dict() for lease in leases]}
    data = with_jobs(data, snapshot, jobs)
    text = json.dumps(_strict(data), indent=2 if pretty else None, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _strict(value: object) -> object:
    """`value` with NaN and infinities as `None`: JSON has no such numbers, and a value
    that is not a number is one nobody could report (a driver's, a remote host's)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def _table_printer(color: str, header: bool | None) -> Callable[..., None]:
    terminal = sys.stdout.isatty()
    if color == "auto":
        use_color = terminal and not os.environ.get("NO_COLOR")
    else:
        use_color = color == "always"
    column_names = terminal if header is None else header
    encoding = (sys.stdout.encoding or "").lower().replace("-", "")
    style = Style(color=use_color, unicode=encoding == "utf8")

    def print_table(
        snapshot: Snapshot, leases: list[Lease], jobs: NodeJobs | None, *, pretty: bool
    ) -> None:
        width = terminal_columns()
        text = render(
            snapshot,
            leases=leases,
            style=style,
            width=width,
            jobs=jobs,
            now=time.time(),
            column_names=column_names,
        )
        sys.stdout.write(text)
        sys.stdout.flush()

    return print_table
