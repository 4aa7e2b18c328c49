"""TLS with a CA and client certificates made in the test, and basic auth and bearer tokens:
what the daemon's web config and a secured Prometheus ask of a client."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwatch.fleet.fetch import HttpOptions
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from tests.helpers.fleet.fakeprom import FakePrometheus, FakeTarget
from tests.helpers.fleet.servers import Reply, Route, fixture, serving

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make certificates"
)
DCGM = Reply(fixture("dcgm_node.prom"))
_LEAF_EXTENSIONS = (
    "basicConstraints=CA:FALSE\n"
    "subjectAltName=IP:127.0.0.1\n"
    "authorityKeyIdentifier=keyid,issuer\n"
    "subjectKeyIdentifier=hash\n"
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def server_context(self, *, require_client: bool) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(directory: Path, name: str) -> Path:
    subject = ("-subj", f"/CN={name}", "-days", "1")
    _openssl("req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem", *subject,
             cwd=directory)  # fmt: skip
    return directory / f"{name}.pem"


def _leaf(directory: Path, name: str, ca: str) -> tuple[Path, Path]:
    (directory / "leaf.ext").write_text(_LEAF_EXTENSIONS)
    files = ("-keyout", f"{name}.key", "-out", f"{name}.csr")
    _openssl("req", *_EC, *files, "-subj", f"/CN={name}", cwd=directory)
    signer = ("-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial")
    _openssl("x509", "-req", "-in", f"{name}.csr", *signer, "-out", f"{name}.pem",
             "-days", "1", "-extfile", "leaf.ext", cwd=directory)  # fmt: skip
    return directory / f"{name}.pem", directory / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = _ca(directory, "lab-ca")
    server = _leaf(directory, "server", "lab-ca")
    client = _leaf(directory, "client", "lab-ca")
    return Pki(ca, *server, *client, other_ca=_ca(directory, "other-ca"))


def test_a_node_behind_mutual_tls_is_read_with_the_ca_and_client_certificate(pki: Pki) -> None:
    with serving(lambda p, h: DCGM, tls=pki.server_context(require_client=True)) as url:
        options = HttpOptions(str(pki.ca), str(pki.client_cert), str(pki.client_key))
        (node,) = ScrapeSource([f"{url}/metrics"], options=options).read().nodes
    assert (node.name, node.up) == ("dgx-a100-03", True)


@pytest.mark.parametrize(
    ("which", "says"),
    [("no-client-cert", "TLS"), ("wrong-ca", "TLS"), ("plain-http", "")],
    ids=["no-client-cert", "wrong-ca", "plain-http"],
)
def test_a_tls_mistake_is_a_node_down_with_why(pki: Pki, which: str, says: str) -> None:
    options = {
        "no-client-cert": HttpOptions(str(pki.ca)),
        "wrong-ca": HttpOptions(str(pki.other_ca), str(pki.client_cert), str(pki.client_key)),
        "plain-http": HttpOptions(),
    }[which]
    with serving(lambda p, h: DCGM, tls=pki.server_context(require_client=True)) as url:
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
def test_basic_auth_over_tls(pki: Pki, password: str, up: bool) -> None:
    header = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    route = basic_auth("alice", "right", DCGM)
    with serving(route, tls=pki.server_context(require_client=False)) as url:
        options = HttpOptions(str(pki.ca), authorization=header)
        (node,) = ScrapeSource([f"{url}/metrics"], options=options).read().nodes
    assert node.up is up
    if not up:
        assert node.error is not None and "credentials" in node.error


def test_prometheus_over_tls_with_a_bearer_token(pki: Pki) -> None:
    prometheus = FakePrometheus([FakeTarget("dcgm", "10.0.0.1:9400", DCGM.body.decode())])

    def route(path: str, headers: dict[str, str]) -> Reply:
        if headers.get("authorization") != "Bearer t0ken":
            return Reply(b"Unauthorized", status=401)
        return prometheus(path, headers)

    with serving(route, tls=pki.server_context(require_client=False)) as url:
        options = HttpOptions(str(pki.ca), authorization="Bearer t0ken")
        fleet = PrometheusSource(url, options=options).read()
    assert [node.name for node in fleet.nodes] == ["dgx-a100-03"]
