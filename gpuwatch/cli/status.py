"""`gpuwatch status`: the GPUs now, as a table or JSON, once or every few seconds."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator

import click

from gpuwatch.backends import open_backend
from gpuwatch.backends.base import Backend
from gpuwatch.cli import reader_gone
from gpuwatch.cli.options import Command, Duration, HostName, WholeNumber, backend_options
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import Lease, Snapshot

_CLEAR_SCREEN = "\x1b[H\x1b[2J"
MAX_WATCH_S = 86400.0
MAX_COUNT = 1_000_000_000


@click.command(cls=Command)
@backend_options
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON: the snapshot's fields, with `gpus`, `processes` and `leases`.",
)
@click.option(
    "--watch",
    "interval_s",
    type=Duration(minimum_s=0.05, maximum_s=MAX_WATCH_S),
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
    type=click.Choice(["auto", "always", "never"]),
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
def status(
    backend: str | None,
    sim: str | None,
    as_json: bool,
    interval_s: float | None,
    count: int | None,
    host: str | None,
    color: str,
    verbose: bool,
) -> None:
    """Show every GPU with its memory, load, temperature, power, processes and leases.

    GPUs are read from the gpuwatch daemon when one runs, else from the driver.

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
    show = _print_json if as_json else _table_printer(color)
    if host is not None:
        from gpuwatch.backends.ssh import remote_snapshots

        if verbose:
            _say(f"reading GPUs of {host} over ssh (gpuwatch status there)")
        frames = remote_snapshots(
            host,
            interval_s=interval_s or 1.0,
            count=count if interval_s else 1,
            backend=backend,
            sim=sim,
        )
    else:
        frames = _local_frames(backend, sim, interval_s, count, verbose)
    try:
        for number, (snapshot, leases) in enumerate(frames):
            if number and not as_json:
                sys.stdout.write(_CLEAR_SCREEN if sys.stdout.isatty() else "\n")
            show(snapshot, leases, pretty=interval_s is None)
    except BrokenPipeError:
        # Here, not in gpuwatch.cli.main: click turns a broken pipe into exit status 1.
        reader_gone()


def _local_frames(
    backend: str | None,
    sim: str | None,
    interval_s: float | None,
    count: int | None,
    verbose: bool,
) -> Iterator[tuple[Snapshot, list[Lease]]]:
    say = _say if verbose else None
    lease_dir = LeaseDir.read_only(on_refused=say)
    with open_backend(backend, sim, on_fallback=say, on_lost=_say) as source:
        if say is not None:
            say(f"reading GPUs from {_described(source)}")
        if interval_s is None:
            yield source.sample(), _leases(lease_dir, say)
            return
        from gpuwatch.sampling.poller import watch  # a one-shot status does without it

        lost = _LostDaemon(interval_s)
        for snapshot in watch(source, interval_s, count=count, on_unavailable=lost.tell):
            lost.back()
            yield snapshot, _leases(lease_dir, say)


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
    click.echo(f"gpuwatch: {message}", err=True)


def _leases(lease_dir: LeaseDir | None, say: Callable[[str], None] | None) -> list[Lease]:
    if lease_dir is None:
        return []
    found = lease_dir.read()
    if found.skipped and say is not None:
        say(f"skipped {found.skipped} malformed file(s) in the lease directory {lease_dir.path}")
    return found.leases


def _print_json(snapshot: Snapshot, leases: list[Lease], *, pretty: bool) -> None:
    data = {**snapshot.to_dict(), "leases": [lease.to_dict() for lease in leases]}
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


def _table_printer(color: str) -> Callable[..., None]:
    from gpuwatch.cli.table import Style, render
    from gpuwatch.cli.terminal import terminal_columns

    if color == "auto":
        use_color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    else:
        use_color = color == "always"
    encoding = (sys.stdout.encoding or "").lower().replace("-", "")
    style = Style(color=use_color, unicode=encoding == "utf8")

    def print_table(snapshot: Snapshot, leases: list[Lease], *, pretty: bool) -> None:
        width = terminal_columns()
        sys.stdout.write(render(snapshot, leases=leases, style=style, width=width))
        sys.stdout.flush()

    return print_table
