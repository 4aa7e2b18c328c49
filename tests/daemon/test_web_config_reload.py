"""A reload never lowers the endpoint's guard by accident: the files changed under a running
daemon, SIGHUP, and the daemon's word (one line) and behaviour afterwards."""

from __future__ import annotations

import os
import signal
import ssl
from pathlib import Path

import pytest

from gpuwatch.daemon import basic_auth
from tests.helpers.certs import make_certs
from tests.helpers.daemon_net import TcpDaemon, client_tls, tcp_daemon
from tests.helpers.web_config import MUTUAL_TLS, PASSWORD, web_config

pytestmark = pytest.mark.slow

SERVER_TLS = "  cert_file: server.crt\n  key_file: server.key\n"
USERS = {"prometheus": PASSWORD}
# what is written (web.yml, or daemon.toml), and what the line says of it
WEAKER = {
    "truncated": ("web.yml", "", "it sets nothing"),
    "only-comments": ("web.yml", "# being rewritten\n", "it sets nothing"),
    "tls-left-out": ("web.yml", web_config(users=USERS), "it would turn TLS off"),
    "passwords-left-out": ("web.yml", web_config(MUTUAL_TLS), "it would turn passwords off"),
    "client-certificates-left-out": (
        "web.yml",
        web_config(SERVER_TLS, USERS),
        "it would stop requiring verified client certificates",
    ),
    "web-config-left-out-of-the-config-file": (
        "daemon.toml",
        'interval = "0.5s"\n',
        "no web config (none in {dir}/daemon.toml): it would turn TLS off",
    ),
}


@pytest.mark.parametrize(("name", "text", "message"), WEAKER.values(), ids=WEAKER)
def test_a_reload_that_would_weaken_the_endpoint_is_refused(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    # GIVEN a daemon asking for a client certificate and a password, as its config file says
    certs = make_certs(tmp_path)
    (tmp_path / "web.yml").write_text(web_config(MUTUAL_TLS, USERS))
    config = tmp_path / "daemon.toml"
    config.write_text('web_config = "web.yml"\n')
    with tcp_daemon(tmp_path, "--config", str(config)) as daemon:
        daemon.log_line_with("serving")
        # WHEN a file is changed so that it would lower the guard, and the daemon reloaded
        (tmp_path / name).write_text(text)
        os.kill(daemon.process.pid, signal.SIGHUP)
        # THEN it refuses in one line saying why
        refused = daemon.log_line_with("reload")
        assert "reload failed, keeping the settings in force" in refused
        assert message.format(dir=tmp_path) in refused
        # AND still asks for the certificate and the password
        tls = client_tls(certs.ca, certs.client_cert, certs.client_key)
        assert daemon.get("/metrics", tls=tls, user="prometheus", password=PASSWORD).status == 200
        assert daemon.get("/metrics", tls=tls).status == 401
        with pytest.raises((ssl.SSLError, ConnectionError)):
            daemon.get("/metrics", tls=client_tls(certs.ca), user="prometheus", password=PASSWORD)
        with pytest.raises(ConnectionError):
            daemon.get("/metrics", user="prometheus", password=PASSWORD)


def test_a_reload_that_keeps_the_guard_takes_new_certificates_and_users(tmp_path: Path) -> None:
    # GIVEN a daemon asking for a password over TLS
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(web_config(SERVER_TLS, USERS))
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        daemon.log_line_with("serving")
        # WHEN client certificates are asked for too, and another user added
        web.write_text(web_config(MUTUAL_TLS, {**USERS, "grafana": "other"}))
        os.kill(daemon.process.pid, signal.SIGHUP)
        # THEN the reload is taken
        assert "reloaded" in daemon.log_line_with("reload")
        tls = client_tls(certs.ca, certs.client_cert, certs.client_key)
        assert daemon.get("/metrics", tls=tls, user="grafana", password="other").status == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            daemon.get("/metrics", tls=client_tls(certs.ca), user="grafana", password="other")


def _reloaded(daemon: TcpDaemon) -> None:
    os.kill(daemon.process.pid, signal.SIGHUP)
    assert "reloaded" in daemon.log_line_with("reload")


def test_a_reload_that_changes_nothing_keeps_a_password_verified_for_its_scraper(
    tmp_path: Path,
) -> None:
    # GIVEN a daemon over TLS whose scraper at 127.0.0.2 got in with its password
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(web_config(SERVER_TLS, USERS))
    tls = client_tls(certs.ca)
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        daemon.log_line_with("serving")
        right = {"tls": tls, "user": "prometheus", "password": PASSWORD, "source": "127.0.0.2"}
        assert daemon.get("/metrics", **right).status == 200
        # WHEN the daemon is reloaded with the web config as it was, and a guesser at the
        # same address tries wrong passwords faster than the scraper scrapes: the budget's
        # worth before the first scrape, and more between the next
        _reloaded(daemon)
        guesses, scrapes = [], []
        for round_ in range(3):
            for number in range(basic_auth.FAILURE_BURST):
                guess = daemon.get("/metrics", **{**right, "password": f"guess {round_}.{number}"})
                guesses.append(guess.status)
            scrapes.append(daemon.get("/metrics", **right).status)
    # THEN the guesses are refused, then told to wait; and every scrape gets in
    burst = basic_auth.FAILURE_BURST
    assert set(guesses[:burst]) == {401} and set(guesses[burst:]) == {429}
    assert scrapes == [200] * 3


def test_a_client_left_with_a_rotated_password_spends_no_budget_of_the_new_one(
    tmp_path: Path,
) -> None:
    # GIVEN a daemon over TLS, and a scraper at 127.0.0.2 that got in with the password
    certs = make_certs(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(web_config(SERVER_TLS, {"prometheus": "old password"}))
    tls = client_tls(certs.ca)
    with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
        daemon.log_line_with("serving")
        old = {"tls": tls, "user": "prometheus", "password": "old password", "source": "127.0.0.2"}
        assert daemon.get("/metrics", **old).status == 200
        # WHEN the password is rotated and the daemon reloaded, and the scraper, not told,
        # scrapes on with the old one, more often than a source's budget of failures
        web.write_text(web_config(SERVER_TLS, {"prometheus": "new password"}))
        _reloaded(daemon)
        stale = [daemon.get("/metrics", **old).status for _ in range(5)]
        # THEN it is refused each time, never told to wait
        assert stale == [401] * 5
        # AND the new password, from the same address, gets in
        new = {**old, "password": "new password"}
        assert [daemon.get("/metrics", **new).status for _ in range(2)] == [200, 200]
