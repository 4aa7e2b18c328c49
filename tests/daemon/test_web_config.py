"""`--web-config`: the TCP listener secured by the file node_exporter and Prometheus read."""

from __future__ import annotations

import os
import signal
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.certs import Certs, make_certs
from tests.helpers.daemon_net import TcpDaemon, client_tls, tcp_daemon
from tests.helpers.web_config import MUTUAL_TLS, PASSWORD, web_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[tuple[TcpDaemon, Certs]]:
    """A daemon whose web config asks for a client certificate and a password; the file
    names its certificates relative to itself, and the daemon runs elsewhere."""
    tmp_path = tmp_path_factory.mktemp("secured")
    config = certs.ca.parent / "web.yml"
    config.write_text(web_config(MUTUAL_TLS, {"prometheus": PASSWORD}))
    env = {"GPUWATCH_LEASE_DIR": str(tmp_path / "leases")}
    with tcp_daemon(tmp_path, "--web-config", str(config), env=env) as daemon:
        yield daemon, certs


def test_a_client_with_its_certificate_and_password_is_served(
    secured: tuple[TcpDaemon, Certs],
) -> None:
    daemon, certs = secured
    tls = client_tls(certs.ca, certs.client_cert, certs.client_key)
    reply = daemon.get("/metrics", tls=tls, user="prometheus", password=PASSWORD)
    assert reply.status == 200 and "gpuwatch_memory_free_bytes{" in reply.body


@pytest.mark.parametrize(
    ("user", "password"),
    [("prometheus", "wrong"), ("nobody", PASSWORD), (None, "")],
    ids=["wrong-password", "unknown-user", "no-credentials"],
)
def test_a_client_without_the_password_is_answered_401_with_a_challenge(
    secured: tuple[TcpDaemon, Certs], user: str | None, password: str
) -> None:
    daemon, certs = secured
    tls = client_tls(certs.ca, certs.client_cert, certs.client_key)
    reply = daemon.get("/metrics", tls=tls, user=user, password=password)
    assert reply.status == 401 and reply.headers["www-authenticate"].startswith("Basic ")
    assert "gpuwatch_" not in reply.body


@pytest.mark.parametrize(
    "client",
    ["no-certificate", "another-cas-certificate"],
)
def test_a_client_without_a_certificate_of_the_ca_is_refused_at_the_handshake(
    secured: tuple[TcpDaemon, Certs], client: str
) -> None:
    daemon, certs = secured
    tls = (
        client_tls(certs.ca)
        if client == "no-certificate"
        else client_tls(certs.ca, certs.stranger_cert, certs.stranger_key)
    )
    with pytest.raises((ssl.SSLError, ConnectionError)):
        daemon.get("/metrics", tls=tls, user="prometheus", password=PASSWORD)
    # AND the daemon serves the next client as before
    good = client_tls(certs.ca, certs.client_cert, certs.client_key)
    assert daemon.get("/-/healthy", tls=good, user="prometheus", password=PASSWORD).status == 200


def test_plain_http_is_not_answered_where_tls_is_asked_for(
    secured: tuple[TcpDaemon, Certs],
) -> None:
    daemon, _ = secured
    with pytest.raises(ConnectionError):
        daemon.get("/metrics", user="prometheus", password=PASSWORD)


def test_a_client_certificate_is_optional_with_verify_if_given(
    tmp_path: Path, certs: Certs
) -> None:
    # GIVEN a web config that verifies a client certificate only where one is sent
    config = certs.ca.parent / "optional.yml"
    config.write_text(
        web_config(MUTUAL_TLS.replace("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"))
    )
    with tcp_daemon(tmp_path, "--web-config", str(config)) as daemon:
        # THEN a client without one is served, and one with a stranger's is refused
        assert daemon.get("/metrics", tls=client_tls(certs.ca)).status == 200
        stranger = client_tls(certs.ca, certs.stranger_cert, certs.stranger_key)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            daemon.get("/metrics", tls=stranger)


def test_basic_auth_over_plain_http_and_new_passwords_on_sighup(tmp_path: Path) -> None:
    # GIVEN a config file naming a web config beside it, with one user
    web = tmp_path / "web.yml"
    web.write_text(web_config(users={"prometheus": "first"}))
    config = tmp_path / "daemon.toml"
    config.write_text('web_config = "web.yml"\n')
    with tcp_daemon(tmp_path, "--config", str(config)) as daemon:
        assert daemon.get("/metrics", user="prometheus", password="first").status == 200
        assert daemon.get("/metrics").status == 401
        # WHEN the password is changed and the daemon reloaded
        web.write_text(web_config(users={"prometheus": "second"}))
        os.kill(daemon.process.pid, signal.SIGHUP)
        daemon.log_line_with("reloaded")
        # THEN the new password is taken, and the old one (whose verdict was kept) no longer
        assert daemon.get("/metrics", user="prometheus", password="second").status == 200
        assert daemon.get("/metrics", user="prometheus", password="first").status == 401


def test_headers_of_the_web_config_come_with_every_answer(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        for path in ("/metrics", "/-/ready", "/nowhere"):
            assert daemon.get(path).headers["x-frame-options"] == "deny"


def test_the_example_web_config_secures_a_node_beside_its_certificates(
    tmp_path: Path, certs: Certs
) -> None:
    # GIVEN examples/web-config.yml copied beside the node's certificates, as in /etc/gpuwatch
    example = Path(__file__).resolve().parents[2] / "examples" / "web-config.yml"
    for name, made in [
        ("server.crt", certs.server_cert),
        ("server.key", certs.server_key),
        ("clients-ca.crt", certs.ca),
    ]:
        (tmp_path / name).write_bytes(made.read_bytes())
    web = tmp_path / "web-config.yml"
    web.write_text(example.read_text())
    # WHEN a daemon takes it, THEN a scraper with a certificate and the example's password gets
    # the metrics, and one without the password does not
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        tls = client_tls(certs.ca, certs.client_cert, certs.client_key)
        assert daemon.get("/metrics", tls=tls, user="prometheus", password="change-me").status == (
            200
        )
        assert daemon.get("/metrics", tls=tls).status == 401


def test_a_reload_with_a_bad_web_config_keeps_the_one_in_force(tmp_path: Path) -> None:
    # GIVEN a daemon asking for a password
    web = tmp_path / "web.yml"
    web.write_text(web_config(users={"prometheus": "first"}))
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        daemon.log_line_with("serving")
        # WHEN the file is spoiled and the daemon reloaded
        web.write_text("basic_auth_users:\n  prometheus: not-a-hash\n")
        os.kill(daemon.process.pid, signal.SIGHUP)
        # THEN it says why in one line, and still asks for the password in force
        failed = daemon.log_line_with("reload")
        assert "reload failed" in failed and "basic_auth_users.prometheus" in failed
        assert daemon.get("/metrics").status == 401
        assert daemon.get("/metrics", user="prometheus", password="first").status == 200
