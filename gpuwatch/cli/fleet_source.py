"""The options that say which fleet to read, shared by `gpuwatch where` and `gpuwatch fleet`.

One table, in `gpuwatch.cli.argv`'s terms (where is parsed without click);
`gpuwatch fleet` turns the same table into click options (`click_options`).
Secrets are named by file, never given on the command line, where every user
of the machine could read them in `ps`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import closing
from typing import Any

from gpuwatch.cli.argv import Option
from gpuwatch.fleet.source import FleetSource
from gpuwatch.units import parse_duration, parse_whole_number

_MAX_SIM_NODES = 10_000

SOURCE_OPTIONS = (
    Option(
        "--prometheus",
        metavar="URL",
        help="Read the fleet from this Prometheus server (or Thanos, VictoriaMetrics, Mimir).  "
        "[default: $GPUWATCH_PROMETHEUS, else ~/.config/gpuwatch/fleet.toml]",
    ),
    Option(
        "--node",
        metavar="HOST[:PORT]",
        repeat=True,
        help="Scrape this node's /metrics directly (a gpuwatch daemon, dcgm-exporter or "
        "nvidia_gpu_exporter); repeatable.",
    ),
    Option("--nodes-file", metavar="FILE", help="Scrape the nodes FILE lists, one per line."),
    Option(
        "--timeout",
        metavar="DURATION",
        convert=parse_duration,
        help="How long one request may take (the server, or each node).",
    ),
    Option("--ca-file", metavar="FILE", help="Trust this CA for https."),
    Option("--client-cert", metavar="FILE", help="Present this client certificate."),
    Option("--client-key", metavar="FILE", help="The client certificate's key."),
    Option(
        "--user",
        metavar="NAME",
        help="Basic auth user; the password comes from "
        "--password-file or $GPUWATCH_FLEET_PASSWORD.",
    ),
    Option("--password-file", metavar="FILE", help="The basic auth password, in a file."),
    Option(
        "--token-file",
        metavar="FILE",
        help="A bearer token, in a file.  [default: $GPUWATCH_FLEET_TOKEN]",
    ),
    Option(
        "--sim",
        metavar="N",
        convert=lambda text: parse_whole_number(text, low=1, high=_MAX_SIM_NODES),
        help="A simulated fleet of N nodes, to try it without one.",
    ),
)


def open_fleet_source(
    values: Mapping[str, Any],
    *,
    placement: bool = False,
    per_node: bool = False,
    idle_after_s: float | None = None,
) -> closing[FleetSource]:
    """The source the options (by `dest`) name, else the environment's or the config
    file's, to use in a `with` block; `InvalidValueError` when none is set. `placement`:
    read only what placement's rules use (`gpuwatch where`); `per_node`: the fleet table's
    figures may come per node, idle holders after `idle_after_s`
    (`gpuwatch.fleet.config.resolve`)."""
    if values["sim"] is not None:
        from gpuwatch.backends.sim_fleet import SimFleet

        return closing(SimFleet(values["sim"]))
    from gpuwatch.fleet.config import SourceOptions, resolve

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
    return closing(
        resolve(options, placement=placement, per_node=per_node, idle_after_s=idle_after_s)
    )


def click_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a click command with `SOURCE_OPTIONS`, each checked by its own converter,
    so that `gpuwatch fleet` takes and refuses them as `gpuwatch where` does."""
    import click

    for option in reversed(SOURCE_OPTIONS):
        command = click.option(
            *option.names,
            option.dest,
            metavar=option.metavar,
            multiple=option.repeat,
            callback=_converted(option),
            help=option.help,
        )(command)
    return command


def _converted(option: Option) -> Callable[[Any, Any, Any], Any]:
    def convert(_: Any, __: Any, value: Any) -> Any:
        import click

        from gpuwatch.errors import InvalidValueError

        if value is None or option.convert is None or option.repeat:
            return value
        try:
            return option.convert(value)
        except InvalidValueError as error:
            raise click.BadParameter(str(error)) from None

    return convert
