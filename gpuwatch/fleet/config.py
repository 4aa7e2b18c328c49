"""Which fleet to read: the options given, else `GPUWATCH_PROMETHEUS`, else the user's
`$XDG_CONFIG_HOME/gpuwatch/fleet.toml` (`~/.config/gpuwatch/fleet.toml`):

    prometheus = "https://prometheus.lab:9090"    # or: nodes = ["node1", "node2:9400"]
    ca_file = "~/.config/gpuwatch/lab-ca.pem"     # or: nodes_file = "~/lab-nodes.txt"
    token_file = "~/.config/gpuwatch/prom-token"  # or: username + password_file
    timeout = "5s"

Credentials are read from files or the environment (`GPUWATCH_FLEET_TOKEN`,
`GPUWATCH_FLEET_PASSWORD`), never from the command line, where every user of the
machine could read them in `ps`.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec.structs import fields, replace

from gpuwatch.errors import InvalidValueError, UnreadableFileError
from gpuwatch.fleet import promapi, prometheus, scrape
from gpuwatch.fleet.fetch import Budget, HttpOptions
from gpuwatch.fleet.names import safe_name, shown_address
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource, Target, parse_target
from gpuwatch.fleet.source import FleetSource, Needs
from gpuwatch.paths import read_regular_file
from gpuwatch.record_fields import Table
from gpuwatch.tomlfile import read_toml
from gpuwatch.units import parse_duration

ENV_PROMETHEUS = "GPUWATCH_PROMETHEUS"
ENV_TOKEN = "GPUWATCH_FLEET_TOKEN"
ENV_PASSWORD = "GPUWATCH_FLEET_PASSWORD"
MAX_SECRET_BYTES = 64 << 10
MAX_NODES_FILE_BYTES = 1 << 20
MAX_TIMEOUT_S = 600.0
MAX_NODES = 100_000
"""The most nodes a config file's `nodes` list names: ten times the largest fleet served."""
_MAX_TEXT_CHARS = 4096
HOW_TO_SET = (
    "no fleet to read: give --prometheus URL or --node HOST (or --nodes-file FILE), set "
    f'{ENV_PROMETHEUS}, or write prometheus = "http://HOST:9090" (or nodes = [...]) in '
)


class SourceOptions(msgspec.Struct, frozen=True):
    """What the command line (or the config file) says of the fleet source. Paths only
    for secrets: the secrets themselves never pass through here."""

    prometheus: str | None = None
    nodes: tuple[str, ...] = ()
    nodes_file: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    username: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    timeout_s: float | None = None


def config_path(env: Mapping[str, str]) -> str:
    """Where the user's fleet config lives."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpuwatch", "fleet.toml")


MORE_BYTES = "a larger fleet needs --max-bytes (about 10MiB per 1,000 nodes of 8 GPUs)"
"""What a command whose answers are over its cap of bytes says to do."""


class Resolved(msgspec.Struct, frozen=True):
    """A source as `resolved` opens it, and how long its reads may take (all of them
    together, for a whole command)."""

    source: FleetSource
    timeout_s: float


def resolved(
    options: SourceOptions,
    env: Mapping[str, str] | None = None,
    *,
    needs: Needs | None = None,
    whole_command: bool = False,
    warn: Callable[[str], None] | None = None,
    max_bytes: int | None = None,
) -> Resolved:
    """The source `options` name, else the environment's, else the config file's;
    `InvalidValueError` (one line) when none is set or one is wrong. `needs`: what the
    reader needs of the fleet; `whole_command`: the timeout bounds every read together
    (a one-shot command's), not each read; `warn` is told, once, where credentials
    would go over plain http; `max_bytes`: what the answers of one read (a whole
    command's, with `whole_command`) may hold in all, else the source's default."""
    env = os.environ if env is None else env
    path = config_path(env)
    file = _from_file(path) if os.path.lexists(path) else None
    if options.prometheus or options.nodes or options.nodes_file:
        chosen = _overlay(_without_source(file), options)
    elif url := env.get(ENV_PROMETHEUS):
        chosen = _overlay(_without_source(file), replace(options, prometheus=url))
    elif file is not None and (file.prometheus or file.nodes or file.nodes_file):
        chosen = _overlay(file, options)
    else:
        raise InvalidValueError(HOW_TO_SET + path)
    if chosen.prometheus and (chosen.nodes or chosen.nodes_file):
        raise InvalidValueError("give either a Prometheus URL or nodes, not both")
    http = http_options(chosen, env)
    if chosen.prometheus:
        timeout_s = chosen.timeout_s or prometheus.DEFAULT_TIMEOUT_S
        most = max_bytes or promapi.DEFAULT_MAX_BYTES
        budget = Budget(timeout_s, most, more=MORE_BYTES) if whole_command else None
        _warn_in_clear(http, [chosen.prometheus], warn)
        read = PrometheusSource(
            chosen.prometheus,
            options=http,
            timeout_s=timeout_s,
            max_bytes=most,
            needs=needs,
            budget=budget,
        )
        return Resolved(read, timeout_s)
    https = bool(chosen.ca_file or chosen.client_cert)
    targets = [parse_target(node, https=https) for node in chosen.nodes]
    if chosen.nodes_file:
        targets += read_nodes_file(chosen.nodes_file, https=https)
    timeout_s = chosen.timeout_s or scrape.DEFAULT_TIMEOUT_S
    _warn_in_clear(http, [target.url for target in targets], warn)
    most = max_bytes or scrape.DEFAULT_MAX_BYTES * len(targets)
    budget = Budget(timeout_s, most, answer_bytes=scrape.DEFAULT_MAX_BYTES, more=MORE_BYTES)
    scraped = ScrapeSource(
        targets, options=http, timeout_s=timeout_s, budget=budget if whole_command else None
    )
    return Resolved(scraped, timeout_s)


def _warn_in_clear(http: HttpOptions, urls: list[str], warn: Callable[[str], None] | None) -> None:
    """Tells `warn` once where credentials would go to a server over plain http, which
    anyone on the path can read."""
    clear = [url for url in urls if url.strip().lower().startswith("http://")]
    if warn is None or http.authorization is None or not clear:
        return
    more = f" and {len(clear) - 1} more" if len(clear) > 1 else ""
    warn(
        f"credentials go in clear text over http:// to {shown_address(clear[0])}{more}: "
        "anyone on the way can read them; use https"
    )


def http_options(options: SourceOptions, env: Mapping[str, str]) -> HttpOptions:
    """TLS files checked readable, and the `Authorization` header from a token or a
    user and password, read from their files or the environment."""
    for path in (options.ca_file, options.client_cert, options.client_key):
        if path is not None and not os.access(path, os.R_OK):
            raise InvalidValueError(f"{safe_name(path)}: cannot read it (TLS file)")
    if options.client_key and not options.client_cert:
        raise InvalidValueError("a client key needs its client certificate (client_cert)")
    token = _secret(options.token_file, "token") if options.token_file else env.get(ENV_TOKEN)
    password = (
        _secret(options.password_file, "password")
        if options.password_file
        else env.get(ENV_PASSWORD)
    )
    if token and options.username:
        raise InvalidValueError("give a bearer token or a user and password, not both")
    authorization = None
    if token:
        authorization = f"Bearer {_checked(token, 'token')}"
    elif options.username:
        if not password:
            raise InvalidValueError(
                f"user {safe_name(options.username)!r} has no password: give a password file "
                f"or set {ENV_PASSWORD}"
            )
        pair = f"{_checked(options.username, 'user')}:{_checked(password, 'password')}"
        authorization = f"Basic {base64.b64encode(pair.encode()).decode()}"
    return HttpOptions(options.ca_file, options.client_cert, options.client_key, authorization)


def _checked(secret: str, what: str) -> str:
    if not secret or not secret.isprintable():
        raise InvalidValueError(f"the {what} is empty or has control characters")
    return secret


def _secret(path: str, what: str) -> str:
    """A secret from a file: its first line (a trailing newline is not part of it)."""
    data = _read_file(path, f"{what} file", MAX_SECRET_BYTES)
    text = data.decode(errors="replace").strip("\r\n")
    return _checked(text.splitlines()[0] if text else "", what)


def read_nodes_file(path: str, *, https: bool = False) -> list[Target]:
    """The nodes named in the file at `path`: one per line, `#` comments and blank lines
    skipped. A line that is not a node is an error naming `path:LINE`."""
    data = _read_file(path, "nodes file", MAX_NODES_FILE_BYTES)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise InvalidValueError(f"nodes file {safe_name(path)}: not UTF-8 text") from None
    targets = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            targets.append(parse_target(entry, https=https))
        except InvalidValueError as error:
            raise InvalidValueError(f"{safe_name(path)}:{number}: {error}") from None
    if not targets:
        raise InvalidValueError(f"{safe_name(path)}: names no node; write one HOST[:PORT] a line")
    return targets


def _read_file(path: str, what: str, max_bytes: int) -> bytes:
    """All of a regular file that another user may have written, at most `max_bytes`
    (`gpuwatch.paths.read_regular_file`); `InvalidValueError` naming the file and why not."""
    try:
        return read_regular_file(path, max_bytes)
    except UnreadableFileError as error:
        why = "not a regular file" if error.kind is not None else str(error)
        raise InvalidValueError(f"{what} {safe_name(path)}: {why}") from None


_KEYS = {f.name for f in fields(SourceOptions)} - {"timeout_s"} | {"timeout"}
_PATHS = ("nodes_file", "ca_file", "client_cert", "client_key", "password_file", "token_file")


def _from_file(path: str) -> SourceOptions:
    try:
        table = read_toml(path)
    except FileNotFoundError:
        return SourceOptions()
    except InvalidValueError as error:
        raise InvalidValueError(f"{safe_name(path)}: {error}") from None
    where = safe_name(path)
    return _options(Table(table, "", _KEYS, lambda bad: InvalidValueError(f"{where}: {bad}")), path)


def _options(table: Table, path: str) -> SourceOptions:
    values: dict[str, Any] = {}
    for key in table.data:
        if key == "nodes":
            values["nodes"] = tuple(table.strings("nodes", limit=MAX_NODES))
            continue
        value = table.string(key, limit=_MAX_TEXT_CHARS)
        if not value:
            raise table.error(f'{key}: give a value, e.g. {key} = "..."')
        if key == "timeout":
            try:
                values["timeout_s"] = parse_duration(value, most_s=MAX_TIMEOUT_S)
            except InvalidValueError as error:
                raise table.error(f"timeout: {error}") from None
        else:
            base = os.path.dirname(os.path.abspath(path))
            values[key] = os.path.join(base, os.path.expanduser(value)) if key in _PATHS else value
    return SourceOptions(**values)


def _without_source(options: SourceOptions | None) -> SourceOptions:
    """The TLS, credentials and timeout of the config file, for a source named elsewhere."""
    if options is None:
        return SourceOptions()
    return replace(options, prometheus=None, nodes=(), nodes_file=None)


def _overlay(base: SourceOptions, given: SourceOptions) -> SourceOptions:
    """`base` with every option `given` sets."""
    changes = {f.name: getattr(given, f.name) for f in fields(given) if getattr(given, f.name)}
    return replace(base, **changes)
