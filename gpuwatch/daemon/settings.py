"""The daemon's settings: command-line flags over an optional TOML file.

The file (`--config`) may set `interval`, `history` and `listen`; flags given
on the command line win over it. SIGHUP reads the file again, so what the
flags leave to it can change without a restart. A file that does not exist
sets nothing (so a unit can name one that an administrator may add later);
one that exists but does not parse is an error.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuwatch.errors import DaemonError, InvalidValueError
from gpuwatch.units import parse_duration

MIN_INTERVAL_S = 0.1
DEFAULT_INTERVAL_S = 1.0
DEFAULT_HISTORY_S = 24 * 3600.0
_CONFIG_KEYS = {"interval", "history", "listen"}


@dataclass(frozen=True, slots=True)
class Settings:
    socket_path: str
    interval_s: float = DEFAULT_INTERVAL_S
    history_s: float = DEFAULT_HISTORY_S
    listen: tuple[str, int] | None = None
    """Where /metrics is also served over TCP; `None`: nowhere."""
    backend: str = "nvml"
    sim: str | None = None
    config_path: str | None = None
    fixed_by_flags: frozenset[str] = frozenset()
    """Settings given as flags, which the config file cannot change."""


def parse_listen(text: str) -> tuple[str, int] | None:
    """`9400` (loopback), `HOST:9400` or `[::1]:9400`; an empty text turns TCP off."""
    if not text:
        return None
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidValueError(
            f"listen {text!r}: give PORT or HOST:PORT, e.g. 9400 or 0.0.0.0:9400"
        )
    return host, int(port)


def parse_interval(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < MIN_INTERVAL_S:
        raise InvalidValueError(f"interval {text!r} is too short: the least is {MIN_INTERVAL_S}s")
    return seconds


def parse_history(text: str) -> float:
    seconds = parse_duration(text)
    if seconds <= 0:
        raise InvalidValueError(f"history {text!r}: keep at least one sample")
    return seconds


def with_config_file(settings: Settings) -> Settings:
    """`settings` with what its config file says, for settings no flag fixed."""
    if settings.config_path is None:
        return settings
    path = Path(settings.config_path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return settings
    except OSError as error:
        raise DaemonError(f"cannot read the config file {path}: {error.strerror}") from error
    except tomllib.TOMLDecodeError as error:
        raise DaemonError(f"{path}: not valid TOML: {error}") from error
    if unknown := set(data) - _CONFIG_KEYS:
        raise DaemonError(
            f"{path}: unknown setting {sorted(unknown)[0]!r}; "
            f"known: {', '.join(sorted(_CONFIG_KEYS))}"
        )
    parsers = {
        "interval": ("interval_s", parse_interval),
        "history": ("history_s", parse_history),
        "listen": ("listen", parse_listen),
    }
    changes: dict[str, Any] = {}
    for key, value in data.items():
        field, parse = parsers[key]
        if key in settings.fixed_by_flags:
            continue
        if not isinstance(value, str):
            raise DaemonError(f'{path}: {key} takes a string, e.g. {key} = "1s"')
        try:
            changes[field] = parse(value)
        except InvalidValueError as error:
            raise DaemonError(f"{path}: {error}") from None
    return replace(settings, **changes)
