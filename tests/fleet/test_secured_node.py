"""One file secures a node for Prometheus and for gpuwatch alike: `where` reads a daemon
whose web config asks for a client certificate and a password, over https."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.cli import run_cli

pytest.importorskip("cryptography", reason="certificates are made with the cryptography package")
pytest.importorskip("bcrypt", reason="the web config's passwords are bcrypt hashes")

from tests.helpers.certs import Certs, make_certs
from tests.helpers.daemon_net import TcpDaemon, tcp_daemon
from tests.helpers.web_config import MUTUAL_TLS, PASSWORD, web_config


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TcpDaemon, Certs]]:
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    config = certs.ca.parent / "web.yml"
    config.write_text(web_config(MUTUAL_TLS, {"prometheus": PASSWORD}))
    home = tmp_path_factory.mktemp("node")
    env = {"GPUWATCH_LEASE_DIR": str(home / "leases")}
    with tcp_daemon(home, "--web-config", str(config), "--node-name", "gpu-sec", env=env) as d:
        yield d, certs


def test_where_reads_a_node_over_mutual_tls_with_a_password(
    secured: tuple[TcpDaemon, Certs], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the daemon wants a client certificate of its CA and the prometheus user's password
    daemon, certs = secured
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    # WHEN where is given the CA, the client's certificate and the password file
    result = run_cli(
        "where", "--allow-busy",
        "--node", f"https://127.0.0.1:{daemon.port}",
        "--ca-file", str(certs.ca),
        "--client-cert", str(certs.client_cert),
        "--client-key", str(certs.client_key),
        "--user", "prometheus",
        "--password-file", str(password),
    )  # fmt: skip
    # THEN it reads the node, under the name the daemon was given
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split(" ")[0] == "gpu-sec"


@pytest.mark.parametrize(
    ("leave_out", "why"),
    [("--password-file", "401"), ("--client-cert", "")],
    ids=["no-password", "no-certificate"],
)
def test_without_the_password_or_the_certificate_the_node_is_down(
    secured: tuple[TcpDaemon, Certs], tmp_path: Path, leave_out: str, why: str
) -> None:
    daemon, certs = secured
    password = tmp_path / "password"
    password.write_text(PASSWORD)
    options = {
        "--ca-file": str(certs.ca),
        "--client-cert": str(certs.client_cert),
        "--client-key": str(certs.client_key),
        "--user": "prometheus",
        "--password-file": str(password),
    }
    del options[leave_out]
    if leave_out == "--client-cert":
        del options["--client-key"]
    if leave_out == "--password-file":
        del options["--user"]
    arguments = [item for pair in options.items() for item in pair]
    result = run_cli(
        "where", "--allow-busy", "-v", "--node", f"https://127.0.0.1:{daemon.port}", *arguments
    )
    # THEN the node cannot be read: it is down, said in one line; nothing fits
    assert result.exit_code == ExitCode.NOT_ENOUGH_GPUS
    assert f"127.0.0.1:{daemon.port}: down:" in result.stderr
    assert why in result.stderr
    assert "Traceback" not in result.stderr
