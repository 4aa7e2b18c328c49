"""Prometheus's web configuration file, for the daemon's TCP listener (`--web-config`).

The YAML file node_exporter and Prometheus read (the exporter-toolkit format), so
that one file secures a node for all of them:

    tls_server_config:            # HTTPS instead of HTTP
      cert_file: server.crt       # relative paths: from the file's own directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, ...
      client_ca_file: clients-ca.crt
      min_version: TLS12          # TLS10 ... TLS13; max_version alike
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:             # user: bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
      prometheus: $2y$10$...

Everything is checked when the file is read (at start, and on SIGHUP): a key this
daemon does not know or does not implement, a bad value, a certificate or key that
cannot be read: one line naming the key, and the daemon does not start (a reload
keeps the configuration in force). Nothing of the file is silently ignored, since
what it leaves out would be security left out.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.daemon.basic_auth import BasicAuth
from gpuwatch.errors import ConfigFileError

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# RequestClientCert asks for a certificate it never uses: here it is not asked for at all.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_ca",
    "client_auth_type",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
}
# Keys of the format this daemon does not implement: refused, never ignored.
_NOT_HERE = {
    "cert": "give the certificate in cert_file",
    "key": "give the key in key_file",
    "cipher_suites": "OpenSSL's defaults apply; remove it",
    "curve_preferences": "OpenSSL's defaults apply; remove it",
    "client_allowed_sans": "issue client certificates from a CA of their own instead",
    "rate_limit": "the daemon caps connections per client already; remove it",
}
_HEADERS: dict[str, Callable[[str], bool]] = {
    "Content-Security-Policy": lambda value: True,
    "X-Frame-Options": lambda value: value.lower() in ("deny", "sameorigin"),
    "X-Content-Type-Options": lambda value: value.lower() == "nosniff",
    "X-XSS-Protection": lambda value: True,
    "Strict-Transport-Security": lambda value: True,
}
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What the TCP listener does with each connection and request."""

    tls: ssl.SSLContext | None = None
    """Wraps each connection in TLS; `None`: plain HTTP."""
    auth: BasicAuth | None = None
    """Checks each request's credentials; `None`: none asked for."""
    headers: tuple[tuple[str, str], ...] = ()
    """Added to every answer."""

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"


def load_web_config(path: str) -> WebConfig:
    """Reads and checks the file at `path`; raises `ConfigFileError` with one line."""
    try:
        data = _read_yaml(path)
        return _build(path, data)
    except _Bad as error:
        raise ConfigFileError(f"the web config {path}: {error}") from None


class _Bad(Exception):
    """One thing wrong in the file, said in one line."""


def _read_yaml(path: str) -> Mapping[str, Any]:
    import yaml

    try:
        with open(path, "rb") as file:
            text = file.read(_MAX_FILE_BYTES + 1)
    except OSError as error:
        raise _Bad(f"cannot read it ({error.strerror or error})") from None
    if len(text) > _MAX_FILE_BYTES:
        raise _Bad(f"over {_MAX_FILE_BYTES >> 20} MiB: not a web config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise _Bad(f"not YAML{where}: {problem}") from None
    if data is None:
        return {}  # an empty file: plain HTTP, no passwords, as the exporters read it
    if not isinstance(data, dict):
        raise _Bad("not a mapping of settings (tls_server_config, basic_auth_users, ...)")
    return data


def _build(path: str, data: Mapping[str, Any]) -> WebConfig:
    known = ("tls_server_config", "http_server_config", "basic_auth_users")
    _check_keys(data, known, "")
    directory = Path(path).parent
    tls = _tls_context(_section(data, "tls_server_config"), directory)
    users = _section(data, "basic_auth_users")
    return WebConfig(
        tls=tls,
        auth=BasicAuth(_hashes(users)) if users else None,
        headers=_headers(_section(data, "http_server_config")),
    )


def _check_keys(data: Mapping[str, Any], known: tuple[str, ...] | set[str], within: str) -> None:
    for key in data:
        name = f"{within}{key}"
        if key in _NOT_HERE:
            raise _Bad(f"{name} is not supported by gpuwatch's daemon: {_NOT_HERE[key]}")
        if key not in known:
            raise _Bad(f"unknown key {name!r}; known here: {', '.join(sorted(known))}")


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Bad(f"{key} takes a mapping of settings, not {type(value).__name__}")
    return value


def _text(section: Mapping[str, Any], key: str, within: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Bad(f"{within}.{key} takes a string, not {value!r}"[:200])
    return value


def _tls_context(section: Mapping[str, Any], directory: Path) -> ssl.SSLContext | None:
    within = "tls_server_config"
    _check_keys(section, _TLS_KEYS, f"{within}.")
    text = {key: _text(section, key, within) for key in _TLS_KEYS - {"prefer_server_cipher_suites"}}
    if not any(text.values()):
        return None
    files = {
        key: str(directory / name)
        for key in ("cert_file", "key_file", "client_ca_file")
        if (name := text[key]) is not None
    }
    for key in ("cert_file", "key_file"):
        if key not in files:
            raise _Bad(f"{within}.{key} is missing: TLS needs cert_file and key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(text["min_version"] or "TLS12", "min_version")
    context.maximum_version = _version(text["max_version"] or "TLS13", "max_version")
    if section.get("prefer_server_cipher_suites", True) is True:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    elif section["prefer_server_cipher_suites"] is not False:
        raise _Bad(f"{within}.prefer_server_cipher_suites takes true or false")
    for key, file in files.items():
        _readable(file, f"{within}.{key}")
    try:
        context.load_cert_chain(files["cert_file"], files["key_file"])
    except ssl.SSLError as error:
        raise _Bad(
            f"{within}.cert_file and key_file: not a PEM certificate and its key "
            f"({error.reason or error})"
        ) from None
    _client_auth(context, text, files)
    return context


def _client_auth(
    context: ssl.SSLContext, text: Mapping[str, str | None], files: Mapping[str, str]
) -> None:
    within = "tls_server_config"
    policy = text["client_auth_type"] or "NoClientCert"
    if policy in ("RequireAnyClientCert", "RequireClientCert"):
        raise _Bad(
            f"{within}.client_auth_type {policy} (a certificate from anyone) is not supported "
            "by gpuwatch's daemon: use RequireAndVerifyClientCert with client_ca_file"
        )
    if policy not in _CLIENT_AUTH:
        raise _Bad(f"{within}.client_auth_type {policy!r}: one of {', '.join(_CLIENT_AUTH)}")
    has_ca = "client_ca_file" in files or text["client_ca"] is not None
    if has_ca and policy == "NoClientCert":
        raise _Bad(f"{within}.client_ca_file is given without a client_auth_type to use it")
    if _CLIENT_AUTH[policy] == ssl.CERT_NONE:
        return
    if not has_ca:
        raise _Bad(f"{within}.client_auth_type {policy} needs client_ca_file: the clients' CA")
    try:
        if "client_ca_file" in files:
            context.load_verify_locations(cafile=files["client_ca_file"])
        else:
            context.load_verify_locations(cadata=text["client_ca"])
    except ssl.SSLError as error:
        raise _Bad(f"{within}.client_ca_file: no PEM certificate ({error.reason})") from None
    context.verify_mode = _CLIENT_AUTH[policy]


def _version(text: str, key: str) -> ssl.TLSVersion:
    if text not in _TLS_VERSIONS:
        raise _Bad(f"tls_server_config.{key} {text!r}: one of {', '.join(_TLS_VERSIONS)}")
    return _TLS_VERSIONS[text]


def _readable(file: str, key: str) -> None:
    """Says which file cannot be read, and why, before OpenSSL says less."""
    try:
        with open(file, "rb"):
            pass
    except OSError as error:
        raise _Bad(f"{key} {file}: cannot read it ({error.strerror or error})") from None
    if not os.path.isfile(file):
        raise _Bad(f"{key} {file}: not a file")


def _hashes(users: Mapping[Any, Any]) -> dict[str, bytes]:
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise _Bad(f"basic_auth_users: {user!r} is not a user name (text without ':')")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise _Bad(
                f"basic_auth_users.{user}: not a bcrypt hash (like $2y$10$ and 53 characters; "
                "make one with htpasswd -nBC 10 \"\" | tr -d ':\\n')"
            )
        hashes[user] = hashed.encode()
    return hashes


def _headers(section: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    within = "http_server_config"
    _check_keys(section, {"http2", "headers"}, f"{within}.")
    if section.get("http2", True) not in (True, False):
        raise _Bad(f"{within}.http2 takes true or false")  # HTTP/1.1 is spoken either way
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise _Bad(f"{within}.headers takes a mapping of header: value")
    found: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise _Bad(f"{within}.headers: {name!r} cannot be set; known: {', '.join(_HEADERS)}")
        if not isinstance(value, str) or not value.isprintable() or not _HEADERS[name](value):
            raise _Bad(f"{within}.headers.{name}: bad value {value!r}"[:200])
        if value:
            found.append((name, value))
    return tuple(found)
