"""`gpuwatch daemon`: sample the GPUs once for everyone, serve clients and Prometheus."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource
from msgspec.structs import replace

from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command, Duration, F, Parsed
from gpuwatch.daemon.service import run_daemon
from gpuwatch.daemon.settings import (
    DEFAULT_HISTORY_S,
    DEFAULT_IDLE_WINDOW_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_JOBS_REFRESH_S,
    JOB_ENGINES,
    MAX_IDLE_WINDOW_S,
    MAX_INTERVAL_S,
    MAX_JOBS_REFRESH_S,
    MIN_IDLE_WINDOW_S,
    MIN_INTERVAL_S,
    MIN_JOBS_REFRESH_S,
    Settings,
    check_retention,
    parse_listen,
    parse_node_name,
)
from gpuwatch.errors import InvalidValueError
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET, ENV_SOCKET
from gpuwatch.paths import daemon_socket_path

_FLAG_SETTINGS = {
    "interval_s": "interval",
    "history_s": "history",
    "listen": "listen",
    "node_name": "node_name",
    "web_config_path": "web_config",
    "jobs": "jobs",
    "jobs_refresh_s": "jobs_refresh",
    "idle_window_s": "idle_window",
    "slurm_conf": "slurm_conf",
    "pod_resources_socket": "pod_resources_socket",
}
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


class FilePath(click.Path):
    """A path, which may not exist yet; not empty (click.Path takes `''`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            flag = param.opts[-1] if param is not None else "the option"
            self.fail(f"give a path, or leave {flag} out", param, ctx)
        return super().convert(value, param, ctx)


def _listen(text: str) -> tuple[str, int] | None:
    if not text:  # in the config file, an empty `listen` turns TCP off; here it is a slip
        raise InvalidValueError("give [HOST:]PORT, or leave --listen out")
    return parse_listen(text)


def _duration_option(
    flag: str, name: str, *, least_s: float, most_s: float | None, default_s: float, help: str
) -> Callable[[F], F]:
    """A duration the daemon keeps to: the help ends with `[default: ...]`, as written."""
    most = {} if most_s is None else {"maximum_s": most_s}
    return click.option(
        flag,
        name,
        type=Duration(minimum_s=least_s, **most),
        default=default_s,
        metavar="DURATION",
        help=help,
    )


def _file_option(flag: str, name: str, *, help: str) -> Callable[[F], F]:
    """A file the daemon reads (it may not be there yet)."""
    return click.option(flag, name, type=FilePath(dir_okay=False), metavar="FILE", help=help)


@click.command(cls=Command, short_help=short_help("daemon"))
@_duration_option(
    "--interval",
    "interval_s",
    least_s=MIN_INTERVAL_S,
    most_s=MAX_INTERVAL_S,
    default_s=DEFAULT_INTERVAL_S,
    help="How often to sample the GPUs (100ms to 1h).  [default: 1s]",
)
@_duration_option(
    "--history",
    "history_s",
    least_s=MIN_INTERVAL_S,
    most_s=None,
    default_s=DEFAULT_HISTORY_S,
    help="How much history to keep in memory (8 GPUs, 24h at 1s: 9.0 MB).  [default: 24h]",
)
@click.option(
    "--socket",
    "socket_path",
    type=FilePath(),  # what is there is the daemon's to refuse, with its own words
    metavar="PATH",
    help="The Unix socket of the API.  [default: $RUNTIME_DIRECTORY/gpuwatch.sock "
    "under systemd, else $XDG_RUNTIME_DIR/gpuwatch.sock, else /run/gpuwatch/gpuwatch.sock "
    "for root and /run/user/UID or /tmp/gpuwatch-UID for others]",
)
@click.option(
    "--listen",
    type=Parsed(_listen, "address"),
    metavar="[HOST:]PORT",
    help="Also serve /metrics, /-/healthy and /-/ready over TCP; a PORT alone listens on "
    "loopback only.",
)
@click.option(
    "--node-name",
    type=Parsed(parse_node_name, "name"),
    metavar="NAME",
    envvar="GPUWATCH_NODE_NAME",
    help="The node's name: the hostname label of every series, the name in the API, and "
    "the node Slurm is asked about where $SLURMD_NODENAME is not set, e.g. where the daemon "
    "runs in a container.  [env: GPUWATCH_NODE_NAME; default: the host name]",
)
@_file_option(
    "--web-config",
    "web_config_path",
    help="Prometheus's web config (YAML, as node_exporter reads it) for --listen: "
    "tls_server_config for HTTPS, basic_auth_users for passwords; re-read on SIGHUP.",
)
@click.option(
    "--jobs",
    type=click.Choice(JOB_ENGINES),
    default="auto",
    help="Who tells which job holds each GPU: auto (the kubelet where its pod-resources "
    "socket is, else Slurm where squeue is on PATH and a slurm.conf is found), slurm, "
    "kubernetes (the pods holding GPUs), or off (never ask).  [default: auto]",
)
@_duration_option(
    "--jobs-refresh",
    "jobs_refresh_s",
    least_s=MIN_JOBS_REFRESH_S,
    most_s=MAX_JOBS_REFRESH_S,
    default_s=DEFAULT_JOBS_REFRESH_S,
    help="How often the jobs are asked for (Slurm: sooner when slurmd starts or ends a job "
    "step).  [default: 30s]",
)
@_duration_option(
    "--idle-window",
    "idle_window_s",
    least_s=MIN_IDLE_WINDOW_S,
    most_s=MAX_IDLE_WINDOW_S,
    default_s=DEFAULT_IDLE_WINDOW_S,
    help="How long a GPU a job holds may compute nothing before it counts as idle "
    "(/v1/jobs, the GpuAllocatedIdle alert).  [default: 10m]",
)
@_file_option(
    "--slurm-conf",
    "slurm_conf",
    help="The slurm.conf of this node's Slurm (gres.conf is read beside it).  "
    "[default: $SLURM_CONF, else /etc/slurm/slurm.conf]",
)
@click.option(
    "--pod-resources-socket",
    "pod_resources_socket",
    type=FilePath(),
    default=DEFAULT_SOCKET,
    envvar=ENV_SOCKET,
    metavar="PATH",
    help=f"The kubelet's pod-resources socket, asked which pod holds each GPU.  "
    f"[env: {ENV_SOCKET}; default: pod-resources/kubelet.sock in /var/lib/kubelet]",
)
@_file_option(
    "--config",
    "config_path",
    help="A TOML file with interval, history, listen, node_name, web_config, jobs, "
    "jobs_refresh, idle_window, slurm_conf and pod_resources_socket; re-read on SIGHUP. "
    "Flags and their "
    "environment variables win over it.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "sim"]),
    default="auto",
    show_default=True,
    help="Where GPUs are read (auto: the NVIDIA driver).",
)
@click.option(
    "--sim",
    metavar="N|FILE",
    help="Serve a simulated node: N GPUs, or a scenario file. It says it is simulated "
    "everywhere, and listens on the system's socket only when --socket names it.",
)
@click.pass_context
def daemon(ctx: click.Context, /, socket_path: str | None, **flags: Any) -> int:
    """Sample the GPUs for every local client, keep history, serve Prometheus.

    Clients (status, pick) use the daemon when it runs and read the driver
    themselves when it does not. SIGHUP re-reads --config and reopens the
    driver; SIGTERM stops. Under systemd: docs/operations/systemd.md. On a
    Slurm node, or a Kubernetes node, it also tells which job or pod holds
    each GPU and which held GPUs sit idle (/v1/jobs, /metrics):
    docs/operations/slurm.md, docs/operations/deployments.md.

    \b
    Examples:
      gpuwatch daemon                 # API on $XDG_RUNTIME_DIR/gpuwatch.sock
      gpuwatch daemon --listen 19400  # + http://127.0.0.1:19400/metrics
      gpuwatch daemon --sim 8 --socket /tmp/gw.sock
      gpuwatch daemon --jobs slurm --idle-window 30m
      curl --unix-socket /tmp/gw.sock http://gw/v1/health
    """
    try:
        check_retention(flags["interval_s"], flags["history_s"])
    except InvalidValueError as error:
        raise click.BadParameter(str(error), param_hint="'--history'") from None
    fixed = frozenset(
        setting
        for name, setting in _FLAG_SETTINGS.items()
        if ctx.get_parameter_source(name) in _GIVEN
    )
    logging.basicConfig(level=logging.INFO, format="gpuwatch daemon: %(message)s")
    # Each option's parameter is named after the setting it gives.
    settings = Settings(socket_path=socket_path or "", fixed_by_flags=fixed, **flags)
    if not socket_path:  # a simulated node takes the system's socket only when told to
        settings = replace(settings, socket_path=daemon_socket_path(simulated=settings.simulated))
    return run_daemon(settings)
