"""No local user, stray file or rude client can stop, crash or mislead the daemon."""

from __future__ import annotations

import base64
import http.client
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch import paths
from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.daemon_client import DaemonBackend, http_get
from gpuwatch.backends.sim import SimBackend
from gpuwatch.daemon import basic_auth
from gpuwatch.daemon.api import Api
from gpuwatch.daemon.settings import Settings
from gpuwatch.errors import BackendError, DaemonUnavailableError, DriverNotFoundError
from gpuwatch.models import Snapshot
from gpuwatch.sampling.poller import Poller
from tests.helpers.certs import make_certs
from tests.helpers.cli import run_cli
from tests.helpers.daemon import (
    SLOW_CLIENTS,
    answering_once,
    flood,
    get_json,
    running_daemon,
)
from tests.helpers.daemon_net import TcpDaemon, client_tls, connect_from, tcp_daemon
from tests.helpers.other_user import as_user, other_user_ids
from tests.helpers.wait import wait_until
from tests.helpers.web_config import PASSWORD, web_config

SERVER_TLS = "  cert_file: server.crt\n  key_file: server.key\n"

pytestmark = pytest.mark.slow


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's own is root's alone)."""
    directory = Path(tempfile.mkdtemp(prefix="gpuwatch-test-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def exchange(connect: tuple[int, object], data: bytes, replies: int = 1) -> list[bytes]:
    """Sends `data` on one connection and reads `replies` whole responses (head + body)."""
    family, address = connect
    with socket.socket(family) as connection:
        connection.settimeout(30)
        connection.connect(address)
        connection.sendall(data)
        stream = connection.makefile("rb")
        answers = []
        for _ in range(replies):
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = stream.readline()
                assert line, f"closed after {answers!r} + {head!r}"
                head += line
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answers.append(head + stream.read(length))
        return answers


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def scrape_statuses(port: int, count: int) -> list[int]:
    """The HTTP status of each of `count` scrapes of /metrics from 127.0.0.1, one by one."""
    request = b"GET /metrics HTTP/1.1\r\n\r\n"
    return [
        status_of(exchange((socket.AF_INET, ("127.0.0.1", port)), request)[0]) for _ in range(count)
    ]


def body_of(answer: bytes) -> object:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


class TestSlowClients:
    def test_a_flood_of_slow_clients_from_one_user_leaves_room_for_others(
        self, public_dir: Path
    ) -> None:
        uid, gid = other_user_ids()
        with running_daemon(public_dir) as (process, sock, _):
            # GIVEN another user holding 130 connections that each send a byte every 2 s
            command = as_user(uid, gid, sys.executable, SLOW_CLIENTS, "unix", str(sock), "130")
            with flood(command):
                # WHEN this user asks, again and again while the flood goes on
                statuses = [get_json(sock, "/v1/health")[0] for _ in range(20)]
                # THEN every question is answered
                assert statuses == [200] * 20
                # AND a plain client of this user finds the daemon
                found = subprocess.run(
                    [sys.executable, "-m", "gpuwatch", "status", "--backend", "daemon", "--json"],
                    env={**os.environ, "GPUWATCH_SOCKET": str(sock)},
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert found.returncode == 0, found.stderr
            assert process.poll() is None

    def test_a_flood_over_tcp_leaves_every_scrape_answered(self, tmp_path: Path) -> None:
        port = free_port()
        with running_daemon(tmp_path, "--listen", str(port)) as (process, _, _):
            # GIVEN 130 slow clients from another address
            with flood([sys.executable, SLOW_CLIENTS, "tcp", str(port), "130"]):
                # WHEN Prometheus scrapes ten times THEN it is answered ten times
                statuses = scrape_statuses(port, 10)
            assert statuses == [200] * 10
            assert process.poll() is None

    def test_one_client_gets_at_most_16_connections_at_once(self, tmp_path: Path) -> None:
        with running_daemon(tmp_path) as (_, sock, _):
            held = []
            try:
                # GIVEN a client with 16 connections open, sending nothing
                for _ in range(16):
                    connection = socket.socket(socket.AF_UNIX)
                    connection.connect(str(sock))
                    held.append(connection)
                # WHEN it opens one more THEN that one is told to come back later, in JSON
                with socket.socket(socket.AF_UNIX) as extra:
                    extra.settimeout(30)
                    extra.connect(str(sock))
                    reply = extra.makefile("rb").read()
                assert status_of(reply) == 503
                assert "too many connections" in str(body_of(reply))
            finally:
                for connection in held:
                    connection.close()

    def test_a_request_trickling_in_is_cut_off_however_often_bytes_arrive(
        self, tmp_path: Path
    ) -> None:
        with running_daemon(tmp_path) as (_, sock, _):
            with socket.socket(socket.AF_UNIX) as slow:
                slow.connect(str(sock))
                slow.settimeout(30)
                # GIVEN a client that sends one byte of a header every 0.2 s, for up to a minute
                for _ in range(300):
                    try:
                        slow.send(b"X")
                    except OSError:
                        break  # let go: what it was told is still to be read
                    slow.setblocking(False)
                    try:
                        if slow.recv(1, socket.MSG_PEEK):
                            break
                    except BlockingIOError:
                        pass
                    slow.setblocking(True)
                    time.sleep(0.2)
                slow.setblocking(True)
                reply = slow.recv(4096)
            # THEN the daemon gave up on the request long before the minute was over
            assert status_of(reply) == 408


class TestHttp:
    @pytest.fixture(params=["unix", "tcp"])
    def endpoint(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> Iterator[tuple[int, object]]:
        port = free_port()
        with running_daemon(tmp_path, "--listen", str(port)) as (_, sock, _):
            if request.param == "unix":
                yield socket.AF_UNIX, str(sock)
            else:
                yield socket.AF_INET, ("127.0.0.1", port)

    def test_keep_alive_stays_in_step_after_a_405_with_a_body(
        self, endpoint: tuple[int, object]
    ) -> None:
        # GIVEN a POST with a body, then a GET, on one kept-alive connection
        requests = (
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nx=1GET /metrics HTTP/1.1\r\n\r\n"
        )
        # WHEN both are answered
        refused, answered = exchange(endpoint, requests, replies=2)
        # THEN the POST is refused with what is allowed, and the GET is served
        assert status_of(refused) == 405 and b"\r\nAllow: GET, HEAD\r\n" in refused
        assert "only reads" in str(body_of(refused))
        assert status_of(answered) == 200 and b"gpuwatch_sampling_up" in answered

    @pytest.mark.parametrize(
        ("request_bytes", "status"),
        [
            (b"GET /nothing HTTP/1.1\r\n\r\n", 404),
            (b"DELETE /metrics HTTP/1.1\r\n\r\n", 405),
            (b"hello\r\n\r\n", 400),
            (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
            (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", 400),
            (b"GET /metrics HTTP/1.1\r\nContent-Length: many\r\n\r\n", 400),
            (b"POST /metrics HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", 413),
            (b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
            (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
        ],
        ids=[
            "unknown-path",
            "delete",
            "not-http",
            "http2",
            "bad-header",
            "bad-length",
            "body-too-big",
            "chunked",
            "head-too-big",
        ],
    )
    def test_every_error_is_json(
        self, endpoint: tuple[int, object], request_bytes: bytes, status: int
    ) -> None:
        (answer,) = exchange(endpoint, request_bytes)
        assert status_of(answer) == status
        assert b"\r\nContent-Type: application/json\r\n" in answer
        assert isinstance(body_of(answer), dict) and "error" in body_of(answer)  # type: ignore[operator]

    def test_head_has_the_length_of_get_and_no_body(self, endpoint: tuple[int, object]) -> None:
        family, address = endpoint
        with socket.socket(family) as connection:
            connection.settimeout(30)
            connection.connect(address)
            connection.sendall(
                b"HEAD /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"
            )
            replies = connection.makefile("rb").read()
        head, after = replies.split(b"\r\n\r\n", 1)
        assert status_of(head) == 200 and after.startswith(b"HTTP/1.1 200 OK\r\n")
        get_head, body = after.split(b"\r\n\r\n", 1)
        length = int(get_head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert len(body) == length and b"\r\nConnection: close" in get_head


def test_clients_that_leave_early_cost_no_traceback(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"PYTHONUNBUFFERED": "1"}) as (process, sock, _):
        # GIVEN clients that ask for big answers and hang up before reading them
        for _ in range(30):
            with socket.socket(socket.AF_UNIX) as rude:
                rude.connect(str(sock))
                rude.sendall(
                    b"GET /v1/history?last=1h HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n"
                )
        assert get_json(sock, "/v1/health")[0] == 200
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    # THEN the log says nothing of them
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


class TestSocketPath:
    @pytest.mark.parametrize(
        ("planted", "exit_code", "message"),
        [
            ("file", 2, "a regular file is there, not a socket; it is left alone"),
            ("directory", 2, "a directory is there, not a socket; it is left alone"),
            ("live-socket", 1, "another gpuwatch daemon is serving"),
            ("dead-socket", 0, ""),
        ],
    )
    def test_only_a_stale_socket_another_user_left_at_the_socket_path_is_replaced(
        self, public_dir: Path, planted: str, exit_code: int, message: str
    ) -> None:
        uid, gid = other_user_ids()
        # GIVEN a directory where everyone may write (like an old /run/gpuwatch), and
        # something another user put at the socket's path
        public_dir.chmod(0o1777)
        path = public_dir / "gpuwatch.sock"
        plant = {
            "file": f"open({str(path)!r}, 'w').write('x')",
            "directory": f"import os; os.mkdir({str(path)!r}, 0o700); open('{path}/f', 'w')",
            "dead-socket": f"import socket; socket.socket(socket.AF_UNIX).bind({str(path)!r})",
            "live-socket": "",
        }[planted]
        squatter = None
        if planted == "live-socket":
            squatter = subprocess.Popen(
                as_user(
                    uid,
                    gid,
                    sys.executable,
                    "-c",
                    "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
                    f"s.bind({str(path)!r}); s.listen(); print('up', flush=True); time.sleep(600)",
                ),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert squatter.stdout is not None and squatter.stdout.readline() == "up\n"
        else:
            subprocess.run(as_user(uid, gid, sys.executable, "-c", plant), check=True, timeout=60)
        before = os.lstat(path)
        assert before.st_uid == uid
        try:
            if exit_code == 0:
                # WHEN the daemon starts THEN a stale socket gives way to one of its own
                with running_daemon(public_dir) as (_, sock, _):
                    assert sock == path and os.lstat(sock).st_uid == os.geteuid()
                    assert get_json(sock, "/v1/health")[0] == 200
                return
            # WHEN the daemon starts THEN it refuses in one line, and leaves the thing alone
            result = run_cli("daemon", "--sim", "2", "--socket", str(path))
            assert result.exit_code == exit_code and message in result.stderr
            assert result.stderr.count("\n") == 1
            assert os.lstat(path).st_ino == before.st_ino
        finally:
            if squatter is not None:
                squatter.kill()
                squatter.communicate(timeout=10)


class TestWithoutXdgRuntimeDir:
    def test_a_user_without_a_runtime_dir_gets_a_socket_of_their_own_and_is_told_where(
        self, public_dir: Path
    ) -> None:
        uid, gid = other_user_ids()
        (public_dir / "node.toml").write_text("[[gpu]]\ncount = 2\n")
        env = {
            k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "GPUWATCH_SOCKET")
        }
        env["HOME"] = str(public_dir)
        # GIVEN a user with no XDG_RUNTIME_DIR (cron, ssh without logind)
        # WHEN they start the daemon as the README shows it
        daemon = subprocess.Popen(
            as_user(
                uid,
                gid,
                sys.executable,
                "-m",
                "gpuwatch",
                "daemon",
                "--sim",
                str(public_dir / "node.toml"),
                "--interval",
                "0.2s",
            ),
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            cwd=public_dir,
        )
        try:
            assert daemon.stderr is not None
            line = daemon.stderr.readline()
            # THEN it serves, and says where
            assert "serving a simulated node" in line, line + daemon.stderr.read()
            where = line.split(" on ", 1)[1].split()[0].rstrip(",")
            assert where in (f"/run/user/{uid}/gpuwatch.sock", f"/tmp/gpuwatch-{uid}/gpuwatch.sock")
            assert os.lstat(where).st_uid == uid
            # AND that user's clients find it with no setting
            status = subprocess.run(
                as_user(
                    uid,
                    gid,
                    sys.executable,
                    "-m",
                    "gpuwatch",
                    "status",
                    "--backend",
                    "daemon",
                    "--json",
                ),
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                cwd=public_dir,
            )
            assert status.returncode == 0, status.stderr
        finally:
            daemon.terminate()
            daemon.communicate(timeout=30)
            shutil.rmtree(f"/tmp/gpuwatch-{uid}", ignore_errors=True)


class _DriverThatFails(Backend):
    """Samples like a simulated node until `failing` is set: then fails as a whole, as a
    driver unloaded under the daemon does, and cannot be opened again either."""

    name = "failing"
    failing = threading.Event()

    def __init__(self) -> None:
        if self.failing.is_set():
            raise DriverNotFoundError("the NVIDIA driver is not loaded")
        self._sim = SimBackend(2)

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        if self.failing.is_set():
            raise BackendError("Driver Not Loaded")
        return self._sim.sample(scope)

    def close(self) -> None:
        pass


class TestDriverFailingAsAWhole:
    @pytest.fixture
    def api(self) -> Iterator[Api]:
        _DriverThatFails.failing.clear()
        poller = Poller(_DriverThatFails, 0.05, 60)
        api = Api(poller, Settings(socket_path="unused", sim="2"))
        poller.start()
        try:
            wait_until(lambda: api.snapshot({}).status == 200, "a first snapshot")
            yield api
        finally:
            poller.stop()

    def test_the_last_snapshot_is_not_served_as_current(self, api: Api) -> None:
        # GIVEN a daemon that sampled, WHEN the driver fails as a whole
        _DriverThatFails.failing.set()
        wait_until(lambda: api.poller.state.error is not None, "the failure to show")
        # THEN the snapshot is refused as when sampling stalls, and health says why
        snapshot = api.snapshot({})
        assert snapshot.status == 503 and b"sampling fails" in snapshot.body
        health = json.loads(api.health({}).body)
        assert api.health({}).status == 503 and health["status"] == "failing"
        # the failed sample or the failed reopen after it, whichever came last
        assert "not loaded" in health["last_error"].lower()

    def test_every_gpu_is_down_in_the_metrics(self, api: Api) -> None:
        _DriverThatFails.failing.set()
        wait_until(lambda: api.poller.state.error is not None, "the failure to show")
        families = {
            family.name: family.samples
            for family in text_string_to_metric_families(api.metrics({}).body.decode())
        }
        assert [sample.value for sample in families["gpuwatch_gpu_up"]] == [0, 0]
        assert families["gpuwatch_sampling_up"][0].value == 0
        assert "gpuwatch_memory_free_bytes" not in families, "no reading of an old snapshot"


def test_a_client_refuses_a_snapshot_older_than_the_daemon_allows(tmp_path: Path) -> None:
    # GIVEN a daemon (of an older version, or frozen) that serves a snapshot 30 s old
    old = msgspec.structs.replace(SimBackend(1).sample(), taken_at=time.time() - 30)
    body = json.dumps(old.to_dict()).encode()
    path = str(tmp_path / "old.sock")
    # WHEN a client reads it THEN it does not take it for the GPUs' state
    with (
        answering_once(path, body, headers="X-Gpuwatch-Stale-After: 10\r\n"),
        pytest.raises(DaemonUnavailableError, match="snapshot 30s old"),
    ):
        DaemonBackend(path)


FAKENVML = Path(
    os.environ.get("FAKENVML_DIR", Path(__file__).resolve().parents[3] / "shared" / "fakenvml")
)


@pytest.mark.skipif(
    not (FAKENVML / "Makefile").is_file() or shutil.which("make") is None,
    reason="needs ../shared/fakenvml and a C compiler",
)
def test_a_driver_unloaded_under_the_daemon_is_never_served_as_current(tmp_path: Path) -> None:
    build = tmp_path / "fakenvml"
    subprocess.run(
        ["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True, capture_output=True
    )
    scenario = tmp_path / "node.txt"
    shutil.copy(FAKENVML / "scenarios" / "h100-1gpu.txt", scenario)
    sock = tmp_path / "gpuwatch.sock"
    env = {**os.environ, "LD_LIBRARY_PATH": str(build), "FAKENVML_SCENARIO": str(scenario)}
    env.pop("GPUWATCH_SIM", None)
    command = [sys.executable, "-m", "gpuwatch", "daemon", "--backend", "nvml"]
    with subprocess.Popen(
        [*command, "--socket", str(sock), "--interval", "0.2s"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as daemon:
        try:
            wait_until(lambda: get_json(sock, "/v1/health")[0] == 200, "the daemon to serve")
            # GIVEN the driver unloaded, WHEN the daemon reopens it (SIGHUP) and that fails
            scenario.unlink()
            daemon.send_signal(signal.SIGHUP)
            health = wait_until(
                lambda: (h := get_json(sock, "/v1/health"))[0] == 503 and h[1], "the failure"
            )
            # THEN the old snapshot is not served, and every GPU is down in the metrics
            assert health["status"] == "failing" and "not loaded" in health["last_error"]
            status, answer = get_json(sock, "/v1/snapshot")
            assert status == 503 and "sampling fails" in answer["error"]
            metrics = http_get(str(sock), "/metrics")[1].decode()
            assert (
                'gpuwatch_gpu_up{gpu="0"' in metrics
                and "gpuwatch_memory_free_bytes{" not in metrics
            )
            assert re.search(r"^gpuwatch_gpu_up\{.*\} 0\.0$", metrics, re.MULTILINE)
            # AND a client does not take the daemon's word for the GPUs
            with pytest.raises(DaemonUnavailableError, match="no current snapshot"):
                DaemonBackend(str(sock))
        finally:
            daemon.terminate()


def test_root_without_a_runtime_dir_serves_where_every_client_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the system socket is root's")
    # GIVEN root, in a container or a cron job: no XDG_RUNTIME_DIR, no systemd
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    system_dir = tmp_path / "run-gpuwatch"
    monkeypatch.setattr(paths, "SYSTEM_DIR", str(system_dir))
    monkeypatch.setattr(paths, "SYSTEM_SOCKET", str(system_dir / "gpuwatch.sock"))
    # WHEN the daemon picks its socket THEN it is the system's, in a directory only root writes
    assert paths.daemon_socket_path() == str(system_dir / "gpuwatch.sock")
    assert system_dir.stat().st_mode & 0o777 == 0o755


def test_a_lease_directory_of_another_user_names_the_command_that_fixes_it(
    public_dir: Path,
) -> None:
    uid, gid = other_user_ids()
    # GIVEN a shared lease directory that another user made (as the first to pick does in /tmp)
    public_dir.chmod(0o1777)  # like /tmp
    leases = public_dir / "leases"
    subprocess.run(
        as_user(uid, gid, sys.executable, "-c", f"import os; os.mkdir({str(leases)!r}, 0o755)"),
        check=True,
        timeout=60,
    )
    leases.chmod(0o1777)  # as gpuwatch makes it
    # WHEN this user picks
    result = run_cli("pick", "--sim", "2", "--allow-busy", env={"GPUWATCH_LEASE_DIR": str(leases)})
    # THEN the pick is made (leases are advisory), warned in one line naming who could tamper
    # with the leases and the one command an administrator runs
    assert result.exit_code == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "lease directory" in line]
    assert "`sudo install -d -m 1777 /run/gpuwatch/leases`" in warning
    assert f"lets {pwd.getpwuid(uid).pw_name} remove or forge leases" in warning


class TestTcpEndpointUnderAttack:
    """The daemon's TCP listener over TLS with a password, as another host attacks it."""

    @pytest.fixture
    def secured(self, tmp_path: Path) -> Iterator[tuple[TcpDaemon, ssl.SSLContext]]:
        make_certs(tmp_path)
        web = tmp_path / "web.yml"
        web.write_text(web_config(SERVER_TLS, {"prometheus": PASSWORD}))
        with tcp_daemon(tmp_path, "--web-config", str(web)) as daemon:
            yield daemon, client_tls(tmp_path / "ca.crt")

    def test_a_password_flood_leaves_the_scraper_and_the_socket_answered(
        self, secured: tuple[TcpDaemon, ssl.SSLContext]
    ) -> None:
        daemon, tls = secured
        # GIVEN a scraper whose password was verified
        assert daemon.get("/metrics", tls=tls, user="prometheus", password=PASSWORD).status == 200

        # WHEN four addresses guess passwords (each its own: one refused before is refused
        # again without a check) on kept-alive connections until told to wait
        def guess(source: str) -> list[tuple[int, str | None]]:
            with guessing_connection(daemon.port, source) as connection:
                answers = []
                for n in range(basic_auth.FAILURE_BURST + 3):
                    token = base64.b64encode(f"mallory:{source} guess {n}".encode()).decode()
                    connection.request(
                        "GET", "/metrics", headers={"Authorization": f"Basic {token}"}
                    )
                    response = connection.getresponse()
                    response.read()
                    answers.append((response.status, response.getheader("Retry-After")))
                    if response.status == 429:
                        break
                return answers

        sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
        with ThreadPoolExecutor(len(sources)) as pool:
            guessed = pool.map(guess, sources)
            # THEN meanwhile the scraper and the local socket are answered
            scrapes = [
                daemon.get(
                    "/metrics", tls=tls, user="prometheus", password=PASSWORD, source="127.0.0.6"
                ).status
                for _ in range(5)
            ]
            health = [get_json(daemon.socket_path, "/v1/health")[0] for _ in range(5)]
            answers = list(guessed)
        assert scrapes == [200] * 5 and health == [200] * 5
        # AND each guesser had its budget of checks, then was told when to come back
        for answered in answers:
            statuses = [status for status, _ in answered]
            assert statuses == [401] * basic_auth.FAILURE_BURST + [429], answered
            assert int(answered[-1][1] or 0) >= 1
        # AND the log names each guesser, once
        warning = f"failed {basic_auth.FAILURE_BURST} password checks"
        warned = [daemon.log_line_with(warning) for _ in sources]
        assert sorted(line.split()[2] for line in warned) == sources

    def test_a_handshake_trickled_in_is_cut_off_at_the_first_requests_deadline(
        self, secured: tuple[TcpDaemon, ssl.SSLContext]
    ) -> None:
        daemon, _ = secured
        hello = client_hello()
        with connect_from("127.0.0.7", daemon.port) as slow:
            # GIVEN a client that sends its TLS hello a byte every 0.2 s (over a minute in all)
            closed = False
            for byte in hello[:300]:
                try:
                    slow.send(bytes([byte]))
                except OSError:
                    closed = True
                    break
                readable, _, _ = select.select([slow], [], [], 0.2)
                if readable and not slow.recv(4096, socket.MSG_PEEK):
                    closed = True
                    break
            # THEN the daemon let it go long before it was done
            assert closed, "the handshake was still waited for after a minute"

    def test_eight_addresses_of_idle_connections_leave_a_ninth_served(self, tmp_path: Path) -> None:
        port = free_port()
        with running_daemon(tmp_path, "--listen", str(port)) as (process, _, _):
            # GIVEN 8 addresses holding 16 idle connections each, coming back when let go
            with flood([sys.executable, SLOW_CLIENTS, "idle", str(port), "128"]):
                # WHEN a ninth address scrapes, THEN it is answered every time
                statuses = scrape_statuses(port, 10)
            assert statuses == [200] * 10
            assert process.poll() is None


@contextmanager
def guessing_connection(port: int, source: str) -> Iterator[http.client.HTTPSConnection]:
    """A kept-alive HTTPS connection from `source` that does not check the certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=30, context=context, source_address=(source, 0)
    )
    try:
        yield connection
    finally:
        connection.close()


def client_hello() -> bytes:
    """The first bytes a TLS client sends."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()
