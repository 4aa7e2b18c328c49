"""The daemon's settings: command-line flags over an optional TOML file.

The file (`--config`) may set `interval`, `history`, `listen`, `node_name`,
`web_config`, `jobs`, `jobs_refresh`, `idle_window`, `slurm_conf` and
`pod_resources_socket`; flags
given on the command line (or their environment variables) win over it.
SIGHUP reads the file again, on top of the flags: a setting removed from the
file goes back to its flag or default. A file that does not exist sets nothing
(so a unit can name one that an administrator may add later); one that exists
but does not parse is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from gpuwatch.errors import ConfigFileError, InvalidValueError
from gpuwatch.jobs.engines import ENGINES
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET
from gpuwatch.record_fields import Table
from gpuwatch.tomlfile import read_toml
from gpuwatch.units import format_duration, parse_duration

MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
DEFAULT_INTERVAL_S = 1.0
DEFAULT_HISTORY_S = 24 * 3600.0
MAX_HISTORY_SAMPLES = 1_000_000
"""At most this many samples are kept (96 MB for 8 GPUs): over 11 days at 1 s."""
JOB_ENGINES = ENGINES
DEFAULT_JOBS_REFRESH_S = 30.0
"""How often Slurm is asked by default: one squeue every 30 s costs the daemon well under
0.5 % of a core (bench/daemon_slurm_cost.py); slurmd's spool folder says sooner when a job
starts or ends."""
MIN_JOBS_REFRESH_S = 1.0
MAX_JOBS_REFRESH_S = 3600.0
DEFAULT_IDLE_WINDOW_S = 600.0
MIN_IDLE_WINDOW_S = 1.0
MAX_IDLE_WINDOW_S = 7 * 86400.0
MAX_NODE_NAME_CHARS = 253
_MAX_TEXT_CHARS = 4096
"""As long as a DNS name may be: room for any host's fully qualified name."""
_EXAMPLES = {
    "interval": '"1s"',
    "history": '"24h"',
    "listen": '"19400"',
    "node_name": '"gpu-07"',
    "web_config": '"/etc/gpuwatch/web-config.yml"',
    "jobs": '"auto"',
    "jobs_refresh": '"30s"',
    "idle_window": '"10m"',
    "slurm_conf": '"/etc/slurm/slurm.conf"',
    "pod_resources_socket": f'"{DEFAULT_SOCKET}"',
}


class Settings(msgspec.Struct, frozen=True):
    socket_path: str
    interval_s: float = DEFAULT_INTERVAL_S
    history_s: float = DEFAULT_HISTORY_S
    listen: tuple[str, int] | None = None
    """Where /metrics is also served over TCP; `None`: nowhere."""
    node_name: str | None = None
    """The node's name in what the daemon serves (the `hostname` label of every series);
    `None`: the host name its source reports (the machine's; a simulated node's own)."""
    web_config_path: str | None = None
    """Prometheus's web configuration file (TLS, basic auth) for the TCP listener."""
    backend: str = "nvml"
    sim: str | None = None
    config_path: str | None = None
    jobs: str = "auto"
    """Who tells which job holds each GPU: `auto` (the kubelet where its pod-resources
    socket is, else Slurm where squeue is on PATH and a slurm.conf is found), `slurm`,
    `kubernetes` or `off`."""
    jobs_refresh_s: float = DEFAULT_JOBS_REFRESH_S
    idle_window_s: float = DEFAULT_IDLE_WINDOW_S
    """How long an allocated GPU may sit idle before the `GpuAllocatedIdle` alert."""
    slurm_conf: str | None = None
    """The slurm.conf of Slurm's commands; `None`: $SLURM_CONF, else Slurm's default."""
    pod_resources_socket: str = DEFAULT_SOCKET
    """The kubelet's pod-resources socket (`--jobs kubernetes`, or `auto` where it is)."""
    fixed_by_flags: frozenset[str] = frozenset()
    """Settings given as flags, which the config file cannot change."""

    @property
    def simulated(self) -> bool:
        """Whether the daemon serves a simulated node (`--sim`, `--backend sim`)."""
        return self.sim is not None or self.backend == "sim"


def parse_listen(text: str) -> tuple[str, int] | None:
    """`19400` (loopback), `HOST:19400` or `[::1]:19400`; an empty text turns TCP off."""
    if not text:
        return None
    host, _, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        raise InvalidValueError(
            f"listen {text!r}: write an IPv6 address in brackets, e.g. [::1]:19400"
        )
    if not (port.isdigit() and port.isascii() and len(port) <= 5 and 0 < int(port) < 65536):
        raise InvalidValueError(
            f"listen {text!r}: give PORT or HOST:PORT, e.g. 19400 or 0.0.0.0:19400"
        )
    return (host[1:-1] if bracketed else host) or "127.0.0.1", int(port)


def parse_node_name(text: str) -> str:
    """A node's name as Prometheus labels and `gpuwatch where` show it: printable, without
    spaces (a shell takes it as one word), at most `MAX_NODE_NAME_CHARS` characters."""
    if not text:
        raise InvalidValueError("node name: give a name, e.g. gpu-07")
    if len(text) > MAX_NODE_NAME_CHARS:
        raise InvalidValueError(
            f"node name {text[:40]!r}...: {len(text)} characters; at most {MAX_NODE_NAME_CHARS}"
        )
    if not text.isprintable() or any(character.isspace() for character in text):
        raise InvalidValueError(f"node name {text!r}: no spaces or control characters; e.g. gpu-07")
    return text


def _web_config_path(text: str) -> str:
    if not text:
        raise InvalidValueError("web_config: give a path, or leave it out")
    return text


def parse_jobs(text: str) -> str:
    if text not in JOB_ENGINES:
        raise InvalidValueError(f"jobs {text[:40]!r}: give one of {', '.join(JOB_ENGINES)}")
    return text


def parse_jobs_refresh(text: str) -> float:
    return _duration("jobs_refresh", text, MIN_JOBS_REFRESH_S, MAX_JOBS_REFRESH_S)


def parse_idle_window(text: str) -> float:
    return _duration("idle_window", text, MIN_IDLE_WINDOW_S, MAX_IDLE_WINDOW_S)


def _slurm_conf(text: str) -> str:
    if not text:
        raise InvalidValueError("slurm_conf: give a path, or leave it out")
    return text


def _pod_resources_socket(text: str) -> str:
    if not text:
        raise InvalidValueError("pod_resources_socket: give a path, or leave it out")
    return text


def _duration(name: str, text: str, least_s: float, most_s: float) -> float:
    try:
        seconds = parse_duration(text, most_s=most_s)
    except InvalidValueError as error:
        raise InvalidValueError(f"{name} {error}") from None
    if seconds < least_s:
        raise InvalidValueError(
            f"{name} {text!r} is too short: the least is {format_duration(least_s)}"
        )
    return seconds


def parse_interval(text: str) -> float:
    try:
        seconds = parse_duration(text, most_s=MAX_INTERVAL_S)
    except InvalidValueError as error:
        raise InvalidValueError(f"interval {error}") from None
    if seconds < MIN_INTERVAL_S:
        raise InvalidValueError(f"interval {text!r} is too short: the least is {MIN_INTERVAL_S}s")
    return seconds


def parse_history(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except InvalidValueError as error:
        raise InvalidValueError(f"history {error}") from None
    if seconds <= 0:
        raise InvalidValueError(f"history {text!r}: keep at least one sample")
    return seconds


def check_retention(interval_s: float, history_s: float) -> None:
    """Refuses a history too long to hold in memory (a `d` typed for an `s`, say)."""
    samples = history_s / interval_s
    if samples > MAX_HISTORY_SAMPLES:
        raise InvalidValueError(
            f"history {format_duration(history_s)} at one sample every "
            f"{format_duration(interval_s)} would keep "
            f"{samples:,.0f} samples; keep at most {MAX_HISTORY_SAMPLES:,} (e.g. 24h at 1s)"
        )


def with_config_file(settings: Settings) -> Settings:
    """`settings` (from the flags) with what its config file says, where no flag fixed it."""
    if settings.config_path is None:
        return settings
    path = Path(settings.config_path)
    try:
        data = read_toml(path)
    except FileNotFoundError:
        return settings
    except InvalidValueError as error:
        raise ConfigFileError(f"the config file {path}: {error}") from None
    table = Table(data, "", _EXAMPLES, lambda bad: ConfigFileError(f"{path}: {bad}"))
    parsers = {
        "interval": ("interval_s", parse_interval),
        "history": ("history_s", parse_history),
        "listen": ("listen", parse_listen),
        "node_name": ("node_name", parse_node_name),
        "web_config": ("web_config_path", _web_config_path),
        "jobs": ("jobs", parse_jobs),
        "jobs_refresh": ("jobs_refresh_s", parse_jobs_refresh),
        "idle_window": ("idle_window_s", parse_idle_window),
        "slurm_conf": ("slurm_conf", _slurm_conf),
        "pod_resources_socket": ("pod_resources_socket", _pod_resources_socket),
    }
    changes: dict[str, Any] = {}
    for key in table.data:
        if key in settings.fixed_by_flags:
            continue
        # Each setting's own parser says what its text may hold, as for its flag.
        value = table.string(key, limit=_MAX_TEXT_CHARS, printable=False)
        field, parse = parsers[key]
        try:
            changes[field] = parse(value)
        except InvalidValueError as error:
            raise ConfigFileError(f"{path}: {error}") from None
    if "web_config_path" in changes:  # as a file names its neighbours: from where it lies
        changes["web_config_path"] = str(path.parent / changes["web_config_path"])
    fresh = replace(settings, **changes)
    try:
        check_retention(fresh.interval_s, fresh.history_s)
    except InvalidValueError as error:
        raise ConfigFileError(f"{path}: {error}") from None
    return fresh
