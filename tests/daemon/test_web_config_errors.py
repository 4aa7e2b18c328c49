"""A web config that cannot be used: one line naming what is wrong, exit 2, and no start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.certs import Certs, make_certs
from tests.helpers.daemon_net import free_port, tcp_daemon
from tests.helpers.other_user import other_user_ids
from tests.helpers.web_config import MUTUAL_TLS, web_config

pytestmark = pytest.mark.slow

SERVER = "  cert_file: server.crt\n  key_file: server.key\n"
CASES = {
    "bad-yaml": ("tls_server_config: [cert_file\n", "not YAML at line 2"),
    "not-a-mapping": ("- cert_file\n", "not a mapping of settings"),
    "unknown-key": ("tls_config:\n" + SERVER, "unknown key 'tls_config'"),
    "unknown-tls-key": (
        "tls_server_config:\n  cert_fle: server.crt\n",
        "tls_server_config: unknown key 'cert_fle'",
    ),
    "missing-cert-file": (
        "tls_server_config:\n  cert_file: gone.crt\n  key_file: server.key\n",
        "tls_server_config.cert_file {dir}/gone.crt: cannot read it (No such file or directory)",
    ),
    "no-key-file": (
        "tls_server_config:\n  cert_file: server.crt\n",
        "tls_server_config.key_file is missing",
    ),
    "key-of-another-cert": (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n",
        "not a PEM certificate and its key",
    ),
    "not-a-certificate": (
        "tls_server_config:\n  cert_file: web.yml\n  key_file: server.key\n",
        "not a PEM certificate and its key",
    ),
    "bad-bcrypt-hash": (
        "basic_auth_users:\n  prometheus: secret\n",
        "basic_auth_users.prometheus: not a bcrypt hash",
    ),
    "bad-client-auth-type": (
        "tls_server_config:\n" + SERVER + "  client_auth_type: Sometimes\n",
        "client_auth_type 'Sometimes': one of NoClientCert",
    ),
    "any-client-cert": (
        "tls_server_config:\n" + SERVER + "  client_auth_type: RequireAnyClientCert\n",
        "RequireAnyClientCert (a certificate from anyone) is not supported",
    ),
    "verify-without-ca": (
        "tls_server_config:\n" + SERVER + "  client_auth_type: RequireAndVerifyClientCert\n",
        "needs client_ca_file",
    ),
    "ca-without-policy": (
        "tls_server_config:\n" + SERVER + "  client_ca_file: ca.crt\n",
        "client_ca_file is given without a client_auth_type",
    ),
    "bad-min-version": (
        "tls_server_config:\n" + SERVER + "  min_version: TLS14\n",
        "tls_server_config.min_version 'TLS14': one of TLS12, TLS13",
    ),
    "tls10-allowed": (
        "tls_server_config:\n" + SERVER + "  min_version: TLS10\n",
        "tls_server_config.min_version TLS10: TLS below 1.2 is not served",
    ),
    "tls11-at-most": (
        "tls_server_config:\n" + SERVER + "  max_version: TLS11\n",
        "tls_server_config.max_version TLS11: TLS below 1.2 is not served",
    ),
    "min-above-max": (
        "tls_server_config:\n" + SERVER + "  min_version: TLS13\n  max_version: TLS12\n",
        "min_version is above max_version",
    ),
    "empty-file": ("", "it sets nothing (empty, or only comments)"),
    "only-comments": ("# being rewritten\n", "it sets nothing (empty, or only comments)"),
    "empty-sections": ("tls_server_config:\nhttp_server_config:\n", "it sets nothing"),
    "no-users": (
        "tls_server_config:\n" + SERVER + "basic_auth_users:\n",
        "basic_auth_users is empty",
    ),
    "no-users-in-braces": ("basic_auth_users: {}\n", "basic_auth_users is empty"),
    "bcrypt-cost-15": (
        "basic_auth_users:\n  prometheus: $2b$15$" + "a" * 53 + "\n",
        "basic_auth_users.prometheus: bcrypt cost 15 would cost the daemon seconds",
    ),
    "unsupported-key": (
        "tls_server_config:\n" + SERVER + "  client_allowed_sans: [prometheus]\n",
        "client_allowed_sans is not supported",
    ),
    "bad-header": (
        "http_server_config:\n  headers:\n    Server: gpuwatch\n",
        "'Server' cannot be set",
    ),
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def start_daemon(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    listen = ["--listen", str(free_port()), "--socket", str(tmp_path / "s.sock")]
    return subprocess.run(
        [sys.executable, "-m", "gpuwatch", "daemon", "--sim", "2", *listen, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("text", "message"), CASES.values(), ids=CASES.keys())
def test_a_web_config_that_cannot_be_used_is_one_line_and_exit_2(
    tmp_path: Path, certs: Certs, text: str, message: str
) -> None:
    # GIVEN a web config beside its certificates, wrong in one thing
    web = certs.ca.parent / "web.yml"
    web.write_text(text)
    # WHEN the daemon starts with it
    result = start_daemon(tmp_path, "--web-config", str(web))
    # THEN it does not start, and says what is wrong in one line naming the file
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"the web config {web}: " in result.stderr
    assert message.format(dir=web.parent) in result.stderr
    assert not (tmp_path / "s.sock").exists()


def test_a_web_config_that_is_not_there_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "web.yml"
    result = start_daemon(tmp_path, "--web-config", str(missing))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"the web config {missing}: cannot read it (No such file or directory)" in (
        result.stderr
    )


@pytest.mark.parametrize("where", ["web-config", "cert-file"])
def test_a_fifo_for_a_file_of_the_web_config_is_refused_without_waiting(
    tmp_path: Path, certs: Certs, where: str
) -> None:
    # GIVEN a FIFO nobody writes to where the web config, or its certificate, should be
    # (an open() would wait for a writer, holding the daemon's start)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {fifo}\n  key_file: {certs.server_key}\n")
    web = fifo if where == "web-config" else web
    # WHEN the daemon starts with it
    result = start_daemon(tmp_path, "--web-config", str(web))
    # THEN it does not start, and says what stands there, in one line
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    named = "" if where == "web-config" else "tls_server_config.cert_file "
    assert f"{named}{fifo}: cannot read it (a FIFO, not a regular file)" in result.stderr


def test_a_key_the_daemon_cannot_read_is_refused(tmp_path: Path, certs: Certs) -> None:
    # GIVEN a key file the daemon's user may not read (root reads every file: skip there)
    key = tmp_path / "server.key"
    key.write_bytes(certs.server_key.read_bytes())
    key.chmod(0)
    try:
        key.read_bytes()
    except PermissionError:
        pass
    else:
        pytest.skip("this user reads files whatever their mode (root)")
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: server.key\n"
    )
    result = start_daemon(tmp_path, "--web-config", str(web))
    assert result.returncode == 2 and "key_file" in result.stderr
    assert "cannot read it (Permission denied)" in result.stderr


def beside_their_files(tmp_path: Path, certs: Certs) -> Path:
    """A web config naming a certificate, key and client CA copied beside it; its path."""
    for made in (certs.server_cert, certs.server_key, certs.ca):
        (tmp_path / made.name).write_bytes(made.read_bytes())
        (tmp_path / made.name).chmod(0o600 if made.suffix == ".key" else 0o644)
    web = tmp_path / "web.yml"
    web.write_text(web_config(MUTUAL_TLS))
    return web


def other_group() -> int:
    return other_user_ids()[1]


# file, mode, owner (None: this user), what the line says of it
WRITABLE = {
    "web-config-for-everyone": ("web.yml", 0o666, None, "it: every local user may change it"),
    "key-for-everyone": ("server.key", 0o602, None, "server.key: every local user may change it"),
    "client-ca-for-everyone": ("ca.crt", 0o646, None, "ca.crt: every local user may change it"),
    "key-for-another-group": ("server.key", 0o620, "group", "server.key: the group "),
    "key-of-another-user": ("server.key", 0o600, "user", "server.key: its owner "),
}


@pytest.mark.parametrize(("name", "mode", "owner", "message"), WRITABLE.values(), ids=WRITABLE)
def test_a_web_config_or_file_others_may_change_is_refused(
    tmp_path: Path, certs: Certs, name: str, mode: int, owner: str | None, message: str
) -> None:
    # GIVEN a web config whose file, or one it names, someone else may change
    web = beside_their_files(tmp_path, certs)
    target = tmp_path / name
    if owner == "user":
        os.chown(target, other_user_ids()[0], -1)
    elif owner == "group":
        os.chown(target, -1, other_group())
    target.chmod(mode)
    # WHEN the daemon starts with it THEN it refuses in one line naming the file and who
    result = start_daemon(tmp_path, "--web-config", str(web))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "may change it, and so what secures the endpoint" in result.stderr


def test_a_key_others_may_read_is_warned_of(tmp_path: Path, certs: Certs) -> None:
    # GIVEN a web config whose key every local user may read
    web = beside_their_files(tmp_path, certs)
    (tmp_path / "server.key").chmod(0o644)
    # WHEN the daemon starts THEN it serves, and says so in a line naming the key
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        warning = daemon.log_line_with("private key")
        assert f"key_file {tmp_path}/server.key: every local user may read" in warning
        assert "chmod 600" in warning
