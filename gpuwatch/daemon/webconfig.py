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
what it leaves out would be security left out; and nothing weakens by accident:

- a file that sets nothing (empty, truncated, only comments) and an empty
  `basic_auth_users` are refused, not read as "plain HTTP, no passwords";
- TLS below 1.2 is refused, and so is a bcrypt cost above `MAX_BCRYPT_COST`
  (each new password would cost the daemon seconds of CPU);
- the file, its certificates and key must be the daemon's user's or root's, and
  writable by no one else (else refused); a key that others may read is warned of;
- a reload that would turn TLS, client certificates or passwords off is refused
  (`weakening`): restart the daemon to do that on purpose.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import re
import ssl
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import msgspec

from gpuwatch.daemon.basic_auth import BasicAuth, hash_cost
from gpuwatch.errors import ConfigFileError, UnreadableFileError
from gpuwatch.paths import open_regular_file
from gpuwatch.record_fields import Table

log = logging.getLogger("gpuwatch.daemon")

MAX_BCRYPT_COST = 14
"""About 1 to 2.5 s of CPU a check here; each step above doubles it."""
_TLS_VERSIONS = {
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_OLD_TLS = ("TLS10", "TLS11")
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
    "rate_limit": "the daemon caps connections and failed passwords per client already; remove it",
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
_MAX_TEXT_CHARS = 1 << 16


class WebConfig(msgspec.Struct, frozen=True):
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

    @property
    def client_certificates(self) -> ssl.VerifyMode:
        """Whether a client's certificate is checked: never, where sent, or required."""
        return ssl.CERT_NONE if self.tls is None else self.tls.verify_mode


def weakening(old: WebConfig | None, new: WebConfig | None) -> str | None:
    """What `new` would turn off that `old` has on (TLS, client certificates, passwords);
    `None` when nothing. `None` stands for no web config: plain HTTP, no passwords."""
    old, new = old or WebConfig(), new or WebConfig()
    if old.tls is not None and new.tls is None:
        return "it would turn TLS off"
    if new.client_certificates < old.client_certificates:
        return "it would stop requiring verified client certificates"
    if old.auth is not None and new.auth is None:
        return "it would turn passwords off"
    return None


def keep_learnt(old: WebConfig | None, new: WebConfig | None) -> None:
    """On a reload, `new`'s passwords take over what `old`'s learnt: which were verified,
    which refused (`BasicAuth.keep_learnt`)."""
    if old is not None and new is not None and old.auth is not None and new.auth is not None:
        new.auth.keep_learnt(old.auth)


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
    import yaml  # here: PyYAML's 20 ms of import stay off a daemon without a web config

    try:
        with open_regular_file(path, _MAX_FILE_BYTES) as file:
            _refuse_if_others_may_write(file.status, "it")
            text = file.read()
    except UnreadableFileError as error:
        if error.max_bytes is not None:
            raise _Bad(f"over {_MAX_FILE_BYTES >> 20} MiB: not a web config") from None
        raise _Bad(f"cannot read it ({error})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise _Bad(f"not YAML{where}: {problem}") from None
    if not data:  # as the exporters read it, plain HTTP: here, a file spoiled by accident
        raise _Bad(
            "it sets nothing (empty, or only comments); give tls_server_config or "
            "basic_auth_users, or leave the web config out to serve plain HTTP"
        )
    if not isinstance(data, dict):
        raise _Bad("not a mapping of settings (tls_server_config, basic_auth_users, ...)")
    return data


def _build(path: str, data: Mapping[str, Any]) -> WebConfig:
    top = _table(data, "", ("tls_server_config", "http_server_config", "basic_auth_users"))
    directory = Path(path).parent
    tls = _tls_context(
        _table(top.mapping("tls_server_config"), "tls_server_config", _TLS_KEYS), directory
    )
    users = top.mapping("basic_auth_users")
    if "basic_auth_users" in data and not users:
        raise _Bad(
            "basic_auth_users is empty: give user: bcrypt-hash lines, or leave the key out "
            "to ask for no password"
        )
    headers = _table(top.mapping("http_server_config"), "http_server_config", ("http2", "headers"))
    web = WebConfig(
        tls=tls,
        auth=BasicAuth(_hashes(users)) if users else None,
        headers=_headers(headers),
    )
    if web == WebConfig():
        raise _Bad("it sets nothing; give tls_server_config or basic_auth_users")
    return web


def _table(data: object, within: str, known: Collection[str]) -> Table:
    """`data` as a table of `known` keys; a key of the format this daemon does not implement
    is named as such."""
    for key in data.keys() & _NOT_HERE.keys() if isinstance(data, dict) else ():
        name = f"{within}.{key}" if within else key
        raise _Bad(f"{name} is not supported by gpuwatch's daemon: {_NOT_HERE[key]}")
    return Table(data, within, known, _Bad)


def _text(section: Table, key: str) -> str | None:
    """A text setting; `None` where absent, null or empty. Paths and PEM text, whatever
    their characters: the file is the admin's own."""
    if section.data.get(key) is None:
        return None
    return section.string(key, limit=_MAX_TEXT_CHARS, printable=False) or None


def _tls_context(section: Table, directory: Path) -> ssl.SSLContext | None:
    within = section.where
    text = {key: _text(section, key) for key in _TLS_KEYS - {"prefer_server_cipher_suites"}}
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
    if context.minimum_version > context.maximum_version:
        raise _Bad(f"{within}.min_version is above max_version: no client could connect")
    if section.boolean("prefer_server_cipher_suites", True):
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    for key, file in files.items():
        _check_file(file, f"{within}.{key}", secret=key == "key_file")
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
    if text in _OLD_TLS:
        raise _Bad(
            f"tls_server_config.{key} {text}: TLS below 1.2 is not served (its ciphers are "
            "broken, and every current client speaks TLS12); give TLS12 or TLS13"
        )
    if text not in _TLS_VERSIONS:
        raise _Bad(f"tls_server_config.{key} {text!r}: one of {', '.join(_TLS_VERSIONS)}")
    return _TLS_VERSIONS[text]


def _check_file(file: str, key: str, *, secret: bool) -> None:
    """Says which file cannot be read, and why, before OpenSSL says less (and before it
    waits on a FIFO); refuses one that others may change, and warns of a secret one that
    others may read."""
    try:
        with open_regular_file(file, _MAX_FILE_BYTES) as opened:
            info = opened.status
    except UnreadableFileError as error:
        raise _Bad(f"{key} {file}: cannot read it ({error})") from None
    _refuse_if_others_may_write(info, f"{key} {file}")
    if secret and (reader := _other_readers(info)) is not None:
        log.warning(
            "%s %s: %s may read this private key; chmod 600 it (or 640 with the daemon's group)",
            key,
            file,
            reader,
        )


def _refuse_if_others_may_write(info: os.stat_result, what: str) -> None:
    """Refuses a file that someone but root and the daemon's user may change: they could
    swap the endpoint's certificate, key, client CA or passwords."""
    if info.st_uid not in (0, os.geteuid()):
        writer = f"its owner {_user(info.st_uid)}"
    elif info.st_mode & stat.S_IWOTH:
        writer = "every local user"
    elif info.st_mode & stat.S_IWGRP and info.st_gid not in (0, os.getegid()):
        writer = f"the group {_group(info.st_gid)}"
    else:
        return
    raise _Bad(
        f"{what}: {writer} may change it, and so what secures the endpoint; give it to root "
        "or the daemon's user, writable by no one else (chmod go-w)"
    )


def _other_readers(info: os.stat_result) -> str | None:
    if info.st_mode & stat.S_IROTH:
        return "every local user"
    if info.st_mode & stat.S_IRGRP and info.st_gid not in (0, os.getegid()):
        return f"the group {_group(info.st_gid)}"
    return None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


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
        if (cost := hash_cost(hashed.encode())) > MAX_BCRYPT_COST:
            raise _Bad(
                f"basic_auth_users.{user}: bcrypt cost {cost} would cost the daemon seconds of "
                f"CPU for each new password; give a hash of cost {MAX_BCRYPT_COST} or less "
                "(htpasswd -nBC 10)"
            )
        hashes[user] = hashed.encode()
    return hashes


def _headers(section: Table) -> tuple[tuple[str, str], ...]:
    within = section.where
    section.boolean("http2", True)  # checked, not used: HTTP/1.1 is spoken either way
    headers = section.mapping("headers")
    found: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise _Bad(f"{within}.headers: {name!r} cannot be set; known: {', '.join(_HEADERS)}")
        if not isinstance(value, str) or not value.isprintable() or not _HEADERS[name](value):
            raise _Bad(f"{within}.headers.{name}: bad value {value!r}"[:200])
        if value:
            found.append((name, value))
    return tuple(found)
