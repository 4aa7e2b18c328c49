"""`gpuwatch daemon`: sample the GPUs once for everyone, serve clients and Prometheus."""

from __future__ import annotations

import logging

import click
from click.core import ParameterSource

from gpuwatch.cli.options import Command, Duration
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
}
_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


@click.command(cls=Command)
@click.option(
    "--interval",
    "interval_s",
    type=Duration(minimum_s=MIN_INTERVAL_S, maximum_s=MAX_INTERVAL_S),
    default=DEFAULT_INTERVAL_S,
    metavar="DURATION",
    help="How often to sample the GPUs (100ms to 1h).  [default: 1s]",
)
@click.option(
    "--history",
    "history_s",
    type=Duration(minimum_s=MIN_INTERVAL_S),
    default=DEFAULT_HISTORY_S,
    metavar="DURATION",
    help="How much history to keep in memory (8 GPUs, 24h at 1s: 9.0 MB).  [default: 24h]",
)
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help="The Unix socket of the API.  [default: $RUNTIME_DIRECTORY/gpuwatch.sock "
    "under systemd, else $XDG_RUNTIME_DIR/gpuwatch.sock, else /run/gpuwatch/gpuwatch.sock "
    "for root and /run/user/UID or /tmp/gpuwatch-UID for others]",
)
@click.option(
    "--listen",
    metavar="[HOST:]PORT",
    help="Also serve /metrics, /-/healthy and /-/ready over TCP; a PORT alone listens on "
    "loopback only.",
)
@click.option(
    "--node-name",
    metavar="NAME",
    envvar="GPUWATCH_NODE_NAME",
    help="The node's name: the hostname label of every series, the name in the API, and "
    "the node Slurm is asked about, e.g. where the daemon runs in a container.  "
    "[env: GPUWATCH_NODE_NAME; default: the host name (for Slurm: $SLURMD_NODENAME, else the "
    "short host name)]",
)
@click.option(
    "--web-config",
    "web_config_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Prometheus's web config (YAML, as node_exporter reads it) for --listen: "
    "tls_server_config for HTTPS, basic_auth_users for passwords; re-read on SIGHUP.",
)
@click.option(
    "--jobs",
    type=click.Choice(JOB_ENGINES),
    default="auto",
    help="Who tells which job holds each GPU: auto (Slurm where squeue is on PATH and a "
    "slurm.conf is found), slurm, or off (never ask).  [default: auto]",
)
@click.option(
    "--jobs-refresh",
    "jobs_refresh_s",
    type=Duration(minimum_s=MIN_JOBS_REFRESH_S, maximum_s=MAX_JOBS_REFRESH_S),
    default=DEFAULT_JOBS_REFRESH_S,
    metavar="DURATION",
    help="How often Slurm is asked (sooner when slurmd starts or ends a job step).  [default: 30s]",
)
@click.option(
    "--idle-window",
    "idle_window_s",
    type=Duration(minimum_s=MIN_IDLE_WINDOW_S, maximum_s=MAX_IDLE_WINDOW_S),
    default=DEFAULT_IDLE_WINDOW_S,
    metavar="DURATION",
    help="How long a GPU a job holds may compute nothing before it counts as idle "
    "(/v1/jobs, the GpuAllocatedIdle alert).  [default: 10m]",
)
@click.option(
    "--slurm-conf",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="The slurm.conf of this node's Slurm (gres.conf is read beside it).  "
    "[default: $SLURM_CONF, else /etc/slurm/slurm.conf]",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A TOML file with interval, history, listen, node_name, web_config, jobs, "
    "jobs_refresh, idle_window and slurm_conf; re-read on SIGHUP. Flags and their "
    "environment variables win over it.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nvml", "sim"]),
    default="auto",
    show_default=True,
    help="Where GPUs are read (auto: the NVIDIA driver).",
)
@click.option("--sim", metavar="N|FILE", help="Serve a simulated node: N GPUs, or a scenario file.")
@click.pass_context
def daemon(
    ctx: click.Context,
    interval_s: float,
    history_s: float,
    socket_path: str | None,
    listen: str | None,
    node_name: str | None,
    web_config_path: str | None,
    jobs: str,
    jobs_refresh_s: float,
    idle_window_s: float,
    slurm_conf: str | None,
    config_path: str | None,
    backend: str,
    sim: str | None,
) -> int:
    """Sample the GPUs for every local client, keep history, serve Prometheus.

    Clients (status, pick) use the daemon when it runs and read the driver
    themselves when it does not. SIGHUP re-reads --config and reopens the
    driver; SIGTERM stops. Under systemd: docs/operations/systemd.md. On a
    Slurm node it also tells which job holds each GPU and which held GPUs sit
    idle (/v1/jobs, /metrics): docs/operations/slurm.md.

    \b
    Examples:
      gpuwatch daemon                 # API on $XDG_RUNTIME_DIR/gpuwatch.sock
      gpuwatch daemon --listen 19400  # + http://127.0.0.1:19400/metrics
      gpuwatch daemon --sim 8 --socket /tmp/gw.sock
      gpuwatch daemon --jobs slurm --idle-window 30m
      curl --unix-socket /tmp/gw.sock http://gw/v1/health
    """
    from gpuwatch.daemon.service import run_daemon

    for option, value in (
        ("--socket", socket_path),
        ("--config", config_path),
        ("--web-config", web_config_path),
        ("--slurm-conf", slurm_conf),
    ):
        if value == "":
            raise click.BadParameter(
                f"give a path, or leave {option} out", param_hint=f"'{option}'"
            )
    if listen == "":
        raise click.BadParameter("give [HOST:]PORT, or leave --listen out", param_hint="'--listen'")
    socket_path = socket_path or daemon_socket_path()
    try:
        listen_at = parse_listen(listen) if listen is not None else None
    except InvalidValueError as error:
        raise click.BadParameter(str(error), param_hint="'--listen'") from None
    try:
        node_name = parse_node_name(node_name) if node_name is not None else None
    except InvalidValueError as error:
        raise click.BadParameter(str(error), param_hint="'--node-name'") from None
    try:
        check_retention(interval_s, history_s)
    except InvalidValueError as error:
        raise click.BadParameter(str(error), param_hint="'--history'") from None
    fixed = frozenset(
        setting
        for name, setting in _FLAG_SETTINGS.items()
        if ctx.get_parameter_source(name) in _GIVEN
    )
    logging.basicConfig(level=logging.INFO, format="gpuwatch daemon: %(message)s")
    settings = Settings(
        socket_path=socket_path,
        interval_s=interval_s,
        history_s=history_s,
        listen=listen_at,
        node_name=node_name,
        web_config_path=web_config_path,
        backend=backend,
        sim=sim,
        config_path=config_path,
        jobs=jobs,
        jobs_refresh_s=jobs_refresh_s,
        idle_window_s=idle_window_s,
        slurm_conf=slurm_conf,
        fixed_by_flags=fixed,
    )
    return run_daemon(settings)
