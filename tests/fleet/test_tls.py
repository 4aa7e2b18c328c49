"""TLS with a CA and client certificates made in the test (`tests.helpers.certs`, which
skips this module without the cryptography package), and basic auth and bearer tokens:
what the daemon's web config and a secured Prometheus ask of a client."""

from __future__ import annotations

import base64
import ssl

import pytest

from gpuwatch.fleet.fetch import HttpOptions
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from tests.helpers.certs import Certs, make_certs
from tests.helpers.fleet.fakeprom import FakePrometheus, FakeTarget
from tests.helpers.fleet.servers import Reply, Route, fixture, serving

DCGM = Reply(fixture("dcgm_node.prom"))


def server_context(certs: Certs, *, require_client: bool) -> ssl.SSLContext:
    """The server side of a node behind TLS, asking for a client certificate of the CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs.ca)
    return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"))


def test_a_node_behind_mutual_tls_is_read_with_the_ca_and_client_certificate(pki: Certs) -> None:
    with serving(lambda p, h: DCGM, tls=server_context(pki, require_client=True)) as url:
        options = HttpOptions(str(pki.ca), str(pki.client_cert), str(pki.client_key))
        (node,) = ScrapeSource([f"{url}/metrics"], options=options).read().nodes
    assert (node.name, node.up) == ("dgx-a100-03", True)


@pytest.mark.parametrize(
    ("which", "says"),
    [("no-client-cert", "TLS"), ("wrong-ca", "TLS"), ("plain-http", "")],
    ids=["no-client-cert", "wrong-ca", "plain-http"],
)
def test_a_tls_mistake_is_a_node_down_with_why(pki: Certs, which: str, says: str) -> None:
    # "wrong-ca": the file given as the CA is another authority's certificate
    options = {
        "no-client-cert": HttpOptions(str(pki.ca)),
        "wrong-ca": HttpOptions(str(pki.stranger_cert), str(pki.client_cert), str(pki.client_key)),
        "plain-http": HttpOptions(),
    }[which]
    with serving(lambda p, h: DCGM, tls=server_context(pki, require_client=True)) as url:
        target = url.replace("https:", "http:") if which == "plain-http" else url
        (node,) = ScrapeSource([f"{target}/metrics"], options=options, timeout_s=2).read().nodes
    assert node.up is False
    assert node.error is not None and says in node.error


def basic_auth(user: str, password: str, reply: Reply) -> Route:
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def route(path: str, headers: dict[str, str]) -> Reply:
        return reply if headers.get("authorization") == expected else Reply(b"", status=401)

    return route


@pytest.mark.parametrize(
    ("password", "up"), [("right", True), ("wrong", False)], ids=["right", "wrong"]
)
def test_basic_auth_over_tls(pki: Certs, password: str, up: bool) -> None:
    header = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    route = basic_auth("alice", "right", DCGM)
    with serving(route, tls=server_context(pki, require_client=False)) as url:
        options = HttpOptions(str(pki.ca), authorization=header)
        (node,) = ScrapeSource([f"{url}/metrics"], options=options).read().nodes
    assert node.up is up
    if not up:
        assert node.error is not None and "credentials" in node.error


def test_prometheus_over_tls_with_a_bearer_token(pki: Certs) -> None:
    prometheus = FakePrometheus([FakeTarget("dcgm", "10.0.0.1:9400", DCGM.body.decode())])

    def route(path: str, headers: dict[str, str]) -> Reply:
        if headers.get("authorization") != "Bearer t0ken":
            return Reply(b"Unauthorized", status=401)
        return prometheus(path, headers)

    with serving(route, tls=server_context(pki, require_client=False)) as url:
        options = HttpOptions(str(pki.ca), authorization="Bearer t0ken")
        fleet = PrometheusSource(url, options=options).read()
    assert [node.name for node in fleet.nodes] == ["dgx-a100-03"]
