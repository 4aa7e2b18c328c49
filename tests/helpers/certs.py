"""Certificates made for a test: a CA, a server certificate for 127.0.0.1, a client's."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509", reason="the cryptography package makes the certs")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    """A client certificate of another CA, which the daemon must not take."""
    stranger_key: Path


def make_certs(directory: Path) -> Certs:
    """Writes a CA, the server's and a client's certificate signed by it, and a stranger's."""
    ca_key, ca = _authority("gpuwatch test CA")
    server_key, server = _issued("127.0.0.1", ca_key, ca, server=True)
    client_key, client = _issued("prometheus", ca_key, ca, server=False)
    other_key, other_ca = _authority("another CA")
    stranger_key, stranger = _issued("prometheus", other_key, other_ca, server=False)
    paths = {
        "ca": _write_cert(directory / "ca.crt", ca),
        "server_cert": _write_cert(directory / "server.crt", server),
        "server_key": _write_key(directory / "server.key", server_key),
        "client_cert": _write_cert(directory / "client.crt", client),
        "client_key": _write_key(directory / "client.key", client_key),
        "stranger_cert": _write_cert(directory / "stranger.crt", stranger),
        "stranger_key": _write_key(directory / "stranger.key", stranger_key),
    }
    return Certs(**paths)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _authority(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(name, _name(name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issued(
    name: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = (
        x509.oid.ExtendedKeyUsageOID.SERVER_AUTH
        if server
        else (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH)
    )
    builder = (
        _builder(name, ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(name)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path
