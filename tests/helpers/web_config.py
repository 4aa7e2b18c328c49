"""Web config files (`--web-config`) as tests write them: TLS settings and bcrypt users."""

from __future__ import annotations

import bcrypt

PASSWORD = "correct horse"

MUTUAL_TLS = """\
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
"""


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A hash at the lowest cost bcrypt takes, by default: tests check who gets in, not
    bcrypt's speed."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()


def web_config(tls: str = "", users: dict[str, str] | None = None, cost: int = 4) -> str:
    """The YAML of a web config: a `tls_server_config` body, and users with their passwords
    (hashed at bcrypt's `cost`)."""
    text = f"tls_server_config:\n{tls}" if tls else ""
    if users:
        text += "basic_auth_users:\n" + "".join(
            f"  {user}: {bcrypt_hash(password, cost)}\n" for user, password in users.items()
        )
    return text
