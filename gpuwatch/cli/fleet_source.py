"""The options that say which fleet to read, shared by `gpuwatch where` and `gpuwatch fleet`.

One decorator, so that the two commands take, check and resolve them alike. Secrets are
named by file, never given on the command line, where every user of the machine could
read them in `ps`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from contextlib import closing
from typing import Any

import click

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.cli.options import Duration, F, WholeNumber
from gpuwatch.fleet.config import SourceOptions, resolve
from gpuwatch.fleet.source import FleetSource, Needs

_MAX_SIM_NODES = 10_000


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


def open_fleet_source(
    values: Mapping[str, Any], *, needs: Needs | None = None, whole_command: bool = True
) -> closing[FleetSource]:
    """The source the options (by parameter name) name, else the environment's or the
    config file's, to use in a `with` block; `InvalidValueError` when none is set. `needs`:
    what the command needs of the fleet; `whole_command`: --timeout bounds all its reads
    together (else each: the live screen's refreshes). Where credentials would go over
    plain http, it says so once on stderr."""
    if values["sim"] is not None:
        return closing(SimFleet(values["sim"]))
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
    return closing(resolve(options, needs=needs, whole_command=whole_command, warn=_warn))


def _warn(message: str) -> None:
    sys.stderr.write(f"gpuwatch: warning: {message}\n")
