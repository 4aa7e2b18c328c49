"""The daemon's TCP endpoint under attack: does the right scraper still get its metrics, cheaply?

A daemon over a simulated 8-GPU node serves /metrics over TLS (a certificate made here with
`cryptography`) with one user's password (bcrypt cost 10). A scraper from 127.0.0.1 opens a
new HTTPS connection for each scrape, with the right password, four times a second.

1. Password flood (bench/password_flood.py): 64 kept-alive TLS connections from 127.0.0.2 to
   127.0.0.5 send random passwords for an unknown user for 10 s. Printed: the CPU seconds the
   daemon and the guesser spent in those 10 s (the daemon's quiet 10 s beside it, the scrapes
   included in both), and the median scrape (and local `/v1/health`) quiet and under the flood.
2. Idle connections (bench/slow_clients.py idle): 8 addresses (127.0.0.2 to 127.0.0.9) hold
   16 connections each, sending nothing and coming back when let go: every slot. Printed: the
   slowest and the median of 20 scrapes from a ninth address, and how many were answered.

    python bench/abuse_endpoint.py [RUNS]
"""

from __future__ import annotations

import base64
import datetime
import http.client
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bcrypt
import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

BENCH = Path(__file__).resolve().parent
FLOOD_S = 10.0
SCRAPE_EVERY_S = 0.25
PASSWORD = secrets.token_hex(12)


def make_certificate(directory: Path) -> None:
    """A self-signed certificate for 127.0.0.1 (server.crt) and its key (server.key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "server.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file = directory / "server.key"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Scraper:
    def __init__(self, port: int, ca: Path, sock: Path) -> None:
        self.port = port
        self.tls = ssl.create_default_context(cafile=str(ca))
        self.sock = str(sock)
        token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}

    def scrape(self) -> float:
        """Wall seconds of one scrape on a new connection; inf when it was not served."""
        start = time.perf_counter()
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, timeout=30, context=self.tls
        )
        try:
            connection.request("GET", "/metrics", headers=self.headers)
            response = connection.getresponse()
            served = response.status == 200 and b"gpuwatch_gpu_up" in response.read()
        except (OSError, http.client.HTTPException):
            served = False
        finally:
            connection.close()
        return time.perf_counter() - start if served else float("inf")

    def health(self) -> float:
        """Wall seconds of `/v1/health` on the local socket."""
        start = time.perf_counter()
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(30)
            client.connect(self.sock)
            client.sendall(b"GET /v1/health HTTP/1.1\r\nConnection: close\r\n\r\n")
            while client.recv(65536):
                pass
        return time.perf_counter() - start

    def for_a_while(self, seconds: float) -> tuple[list[float], list[float]]:
        """Scrapes and health checks, one of each every SCRAPE_EVERY_S, for `seconds`."""
        scrapes, checks = [], []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            started = time.monotonic()
            scrapes.append(self.scrape())
            checks.append(self.health())
            time.sleep(max(0.0, SCRAPE_EVERY_S - (time.monotonic() - started)))
        return scrapes, checks


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ms"


def password_flood(scraper: Scraper, daemon: psutil.Process, port: int) -> None:
    before = cpu_s(daemon)
    quiet_scrapes, quiet_checks = scraper.for_a_while(FLOOD_S)
    quiet_cpu_s = cpu_s(daemon) - before
    flood = subprocess.Popen(
        [sys.executable, str(BENCH / "password_flood.py"), str(port), str(FLOOD_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flood.stdout is not None and flood.stdout.readline() == "flooding\n"
    before = cpu_s(daemon)
    scrapes, checks = scraper.for_a_while(FLOOD_S)
    summary = flood.stdout.readline().split()
    flood.wait(timeout=60)
    daemon_cpu_s = cpu_s(daemon) - before
    figures = dict(word.split("=", 1) for word in summary)
    guesser_cpu_s = float(figures.pop("cpu_s"))
    print(
        f"  password flood ({FLOOD_S:g} s): daemon {daemon_cpu_s:.2f} CPU-s (quiet: "
        f"{quiet_cpu_s:.2f}), guesser {guesser_cpu_s:.2f} CPU-s: "
        f"{daemon_cpu_s / guesser_cpu_s:.2f}x (the flood's own cost: "
        f"{(daemon_cpu_s - quiet_cpu_s) / guesser_cpu_s:.2f}x); answers {figures}"
    )
    served = sum(value != float("inf") for value in scrapes)
    print(
        f"  scrape with the right password: {ms(quiet_scrapes)} quiet, {ms(scrapes)} under the "
        f"flood ({statistics.median(scrapes) / statistics.median(quiet_scrapes):.2f}x; "
        f"{served} of {len(scrapes)} served); local /v1/health {ms(quiet_checks)} quiet, "
        f"{ms(checks)} under the flood"
    )


def idle_connections(scraper: Scraper, port: int) -> None:
    hogs = subprocess.Popen(
        [sys.executable, str(BENCH / "slow_clients.py"), "idle", str(port), "128"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hogs.stdout is not None and hogs.stdout.readline() == "flooding\n"
        times = [scraper.scrape() for _ in range(20)]
    finally:
        hogs.kill()
        hogs.wait()
    served = sum(value != float("inf") for value in times)
    print(
        f"  8 addresses x 16 idle connections: a scrape from a ninth took {max(times):.3f} s at "
        f"worst, {ms(times)} median; {served} of {len(times)} served"
    )


def one_run(work: Path) -> None:
    """Both parts against a daemon of its own, so that no run starts on another's budgets."""
    sock, port = work / "gpuwatch.sock", free_port()
    serve = ["--sim", "8", "--socket", str(sock), "--listen", str(port)]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "daemon", *serve, "--web-config", str(work / "web.yml")],
        stderr=subprocess.DEVNULL,
    )
    try:
        scraper = Scraper(port, work / "server.crt", sock)
        deadline = time.monotonic() + 60
        while scraper.scrape() == float("inf"):  # the first pays bcrypt
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit("the daemon did not start")
            time.sleep(0.2)
        password_flood(scraper, psutil.Process(daemon.pid), port)
        idle_connections(scraper, port)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def main(runs: int) -> int:
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-endpoint-"))
    try:
        make_certificate(work)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        (work / "web.yml").write_text(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            f"basic_auth_users:\n  prometheus: {hashed}\n"
        )
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} (shared)")
        for run in range(1, runs + 1):
            print(f"run {run}:", flush=True)
            one_run(work)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
