"""The options that say which fleet to read, shared by `gpuwatch where` and `gpuwatch fleet`.

One decorator, so that the two commands take, check and resolve them alike. Secrets are
named by file, never given on the command line, where every user of the machine could
read them in `ps`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from types import FrameType
from typing import Any

import click

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.cli.options import Duration, F, Parsed, WholeNumber
from gpuwatch.errors import InvalidValueError, SourceError
from gpuwatch.fleet.config import SourceOptions, resolved
from gpuwatch.fleet.source import FleetSource, Needs
from gpuwatch.units import format_duration, format_size, parse_size

_MAX_SIM_NODES = 10_000
MIN_READ_BYTES = 1 << 20
MAX_READ_BYTES = 16 << 30
"""`--max-bytes`' range: a MiB holds a few nodes' answers; 16 GiB of JSON is far more
than a machine running the command decodes."""
AFTER_ANSWERS_S = 0.25
"""How long after the answers' own deadline the whole command's ends: where answers
are late, their error (which says which) comes first."""


def _read_bytes(text: str) -> int:
    size = parse_size(text, unit_required=True)
    if not MIN_READ_BYTES <= size <= MAX_READ_BYTES:
        raise InvalidValueError(
            f"{text!r} is out of range: give {format_size(MIN_READ_BYTES, precision=0)} to "
            f"{format_size(MAX_READ_BYTES, precision=0)}"
        )
    return size


def source_options(command: F) -> F:
    """Decorates a command with the options that name its fleet source (see
    `open_fleet_source`)."""
    options = (
        click.option(
            "--prometheus",
            metavar="URL",
            help="Read the fleet from this Prometheus server (or Thanos, VictoriaMetrics, "
            "Mimir).  [default: $GPUWATCH_PROMETHEUS, else ~/.config/gpuwatch/fleet.toml]",
        ),
        click.option(
            "--node",
            metavar="HOST[:PORT]",
            multiple=True,
            help="Scrape this node's /metrics directly (a gpuwatch daemon, dcgm-exporter or "
            "nvidia_gpu_exporter); repeatable.",
        ),
        click.option(
            "--nodes-file", metavar="FILE", help="Scrape the nodes FILE lists, one per line."
        ),
        click.option(
            "--timeout",
            type=Duration(),
            metavar="DURATION",
            help="How long reading the fleet may take, all of it: the command's every "
            "request together (the live screen: each refresh).",
        ),
        click.option(
            "--max-bytes",
            type=Parsed(_read_bytes, "size"),
            metavar="SIZE",
            help="How much the answers of one read may hold in all, as JSON or text (about "
            "10MiB per 1,000 nodes of 8 GPUs; 1MiB to 16GiB): more is an error, never a "
            "partial fleet.  [default: 256MiB through Prometheus, 8MiB a node scraped]",
        ),
        click.option("--ca-file", metavar="FILE", help="Trust this CA for https."),
        click.option("--client-cert", metavar="FILE", help="Present this client certificate."),
        click.option("--client-key", metavar="FILE", help="The client certificate's key."),
        click.option(
            "--user",
            metavar="NAME",
            help="Basic auth user; the password comes from --password-file or "
            "$GPUWATCH_FLEET_PASSWORD.",
        ),
        click.option("--password-file", metavar="FILE", help="The basic auth password, in a file."),
        click.option(
            "--token-file",
            metavar="FILE",
            help="A bearer token, in a file.  [default: $GPUWATCH_FLEET_TOKEN]",
        ),
        click.option(
            "--sim",
            metavar="N",
            type=WholeNumber(1, _MAX_SIM_NODES),
            help="A simulated fleet of N nodes, to try it without one.",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command


@contextmanager
def open_fleet_source(
    values: Mapping[str, Any], *, needs: Needs | None = None, whole_command: bool = True
) -> Iterator[FleetSource]:
    """The source the options (by parameter name) name, else the environment's or the
    config file's, open for the `with` block; `InvalidValueError` when none is set.
    `needs`: what the command needs of the fleet; `whole_command`: --timeout bounds
    the whole block (every read, and the work after the answers: a one-line
    `SourceError` once it has passed), else each read (the live screen's refreshes).
    Where credentials would go over plain http, it says so once on stderr."""
    if values["sim"] is not None:
        with closing(SimFleet(values["sim"])) as simulated:
            yield simulated
        return
    options = SourceOptions(
        prometheus=values["prometheus"],
        nodes=tuple(values["node"]),
        nodes_file=values["nodes_file"],
        ca_file=values["ca_file"],
        client_cert=values["client_cert"],
        client_key=values["client_key"],
        username=values["user"],
        password_file=values["password_file"],
        token_file=values["token_file"],
        timeout_s=values["timeout"],
    )
    found = resolved(
        options,
        needs=needs,
        whole_command=whole_command,
        warn=_warn,
        max_bytes=values["max_bytes"],
    )
    with closing(found.source) as source:
        if not whole_command:
            yield source
            return
        with _within(found.timeout_s, source.description):
            yield source


@contextmanager
def _within(timeout_s: float, description: str) -> Iterator[None]:
    """Ends the block with a one-line `SourceError` once `timeout_s` (and
    `AFTER_ANSWERS_S`) has passed, by a timer signal: the answers' budget bounds their
    arrival, this the work after them too, wherever it is. Only the main thread gets
    signals: in another, the answers' budget alone bounds the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise SourceError(
            f"{description}: not done within {format_duration(timeout_s)} "
            "(--timeout bounds the whole command: give more)"
        )

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    earlier_s, _ = signal.setitimer(signal.ITIMER_REAL, timeout_s + AFTER_ANSWERS_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier_s:  # another timer was running (a test runner's): it runs on
            left_s = earlier_s - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(0.001, left_s))


def _warn(message: str) -> None:
    sys.stderr.write(f"gpuwatch: warning: {message}\n")
