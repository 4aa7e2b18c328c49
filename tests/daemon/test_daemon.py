"""A real daemon over a simulated node: its API, metrics, faults, signals and clients."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import DaemonBackend, http_get
from gpuwatch.errors import DaemonUnavailableError, InvalidValueError
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.paths import existing
from gpuwatch.request import Request
from tests.helpers.cli import run_cli
from tests.helpers.daemon import SCENARIO, answering_once, get_json, running_daemon
from tests.helpers.fake_nvml import FakeNvml
from tests.helpers.files import what_is_at
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow


def test_api_answers_snapshot_history_leases_and_health(tmp_path: Path, lease_dir: Path) -> None:
    with running_daemon(tmp_path) as (_, sock, _):
        status, snapshot = get_json(sock, "/v1/snapshot")
        assert status == 200 and snapshot["hostname"] == "daemon-node"
        assert [gpu["utilization_pct"] for gpu in snapshot["gpus"]] == [40, 40, 40]
        assert snapshot["processes"][0]["pid"] == 4242

        wait_until(
            lambda: len(get_json(sock, "/v1/history?last=1h")[1]["gpus"][0]["taken_at"]) >= 3,
            "three samples of history",
        )
        history = get_json(sock, "/v1/history?last=1h")[1]
        assert history["interval_s"] == 0.2 and len(history["gpus"]) == 3
        series = history["gpus"][1]
        assert series["memory_used_bytes"][-1] == 10 << 30
        assert series["taken_at"] == sorted(series["taken_at"])
        assert (
            get_json(sock, f"/v1/history?since={time.time() + 60}")[1]["gpus"][0]["taken_at"] == []
        )

        held = _lease_gpu(
            lease_dir,
            GpuSample(index=1, uuid=snapshot["gpus"][1]["uuid"], name=None, pci_bus_id=None),
        )
        leases = get_json(sock, "/v1/leases")[1]["leases"]
        assert [(lease["gpu_index"], lease["pid"]) for lease in leases] == [(1, os.getpid())]
        held.release()

        status, health = get_json(sock, "/v1/health")
        assert status == 200 and health["status"] == "ok" and health["backend"] == "sim"
        assert health["history"]["capacity"] == 24 * 3600 * 5
        assert health["history"]["bytes"] == 24 * 3600 * 5 * (16 + 3 * 11)


def _lease_gpu(lease_dir: Path, gpu: GpuSample):  # type: ignore[no-untyped-def]
    leases = LeaseDir(lease_dir)
    with leases.locked():
        return leases.claim(gpu, mem_bytes=None, command="pytest")


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/v1/nothing", 404),
        ("POST", "/v1/snapshot", 405),
        ("DELETE", "/v1/leases", 405),
        ("GET", "/v1/history?since=yesterday", 400),
        ("GET", "/v1/history?since=nan", 400),
        ("GET", "/v1/history?since=1e999", 400),
    ],
    ids=["unknown-path", "post", "delete", "bad-since", "since-nan", "since-infinite"],
)
def test_api_refuses_what_it_does_not_do(
    tmp_path: Path, method: str, path: str, expected: int
) -> None:
    with running_daemon(tmp_path) as (_, sock, _):
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(sock))
            connection.sendall(f"{method} {path} HTTP/1.0\r\n\r\n".encode())
            reply = connection.makefile("rb").read()
        assert reply.split()[1] == str(expected).encode()


def test_metrics_have_every_gpu_in_base_units(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (_, sock, _):
        status, body = http_get(str(sock), "/metrics")
    assert status == 200
    families = {family.name: family for family in text_string_to_metric_families(body.decode())}
    free = families["gpuwatch_memory_free_bytes"].samples
    assert sorted(sample.labels["gpu"] for sample in free) == ["0", "1", "2"]
    assert {"uuid", "pci_bus_id", "model_name", "hostname"} <= set(free[0].labels)
    utilization = families["gpuwatch_utilization_ratio"].samples
    assert {sample.value for sample in utilization} == {0.4}
    assert families["gpuwatch_gpu_info"].samples[0].labels["driver_version"] == "580.95.05"
    (process,) = families["gpuwatch_process_memory_bytes"].samples
    assert process.labels["pid"] == "4242" and process.value == 10 << 30
    assert "gpuwatch_leases" in families and "gpuwatch_daemon_process_cpu_seconds" in families


def test_metrics_over_tcp_when_asked(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        running_daemon(tmp_path, "--listen", str(port)),
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply,
    ):
        assert b"gpuwatch_memory_free_bytes" in reply.read()


def test_a_fault_injected_at_run_time_shows_on_that_gpu_only(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (process, sock, scenario):
        faulty = SCENARIO.replace("[[process]]", "[[gpu]]\nfault = 'lost'\n[[process]]")
        spare = tmp_path / "spare.toml"
        spare.write_text(faulty)
        os.replace(spare, scenario)
        snapshot = wait_until(
            lambda: (s := get_json(sock, "/v1/snapshot")[1]) and len(s["gpus"]) == 4 and s,
            "the lost GPU to show",
        )
        assert [gpu["error"] for gpu in snapshot["gpus"]] == [None, None, None, "GPU is lost"]
        health = get_json(sock, "/v1/health")[1]
        assert health["status"] == "degraded" and health["gpus_with_errors"] == [3]
        assert process.poll() is None


def test_systemd_hears_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    notify_path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(notify_path)
        listener.settimeout(10)
        env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "200000"}
        with running_daemon(tmp_path, env=env) as (process, _, _):
            messages = [listener.recv(4096).decode() for _ in range(3)]
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=10)
            while "STOPPING=1" not in messages[-1]:
                messages.append(listener.recv(4096).decode())
    assert "READY=1" in messages[0].splitlines()
    assert any("WATCHDOG=1" in message.splitlines() for message in messages[1:])
    assert "STOPPING=1" in messages[-1].splitlines()


def test_systemd_status_names_one_gpu_in_the_singular(tmp_path: Path) -> None:
    # GIVEN a daemon over a node of one GPU, started under systemd's notify socket
    notify_path = str(tmp_path / "notify")
    one_gpu = '[[gpu]]\nload = "constant"\nutilization_pct = 40\n'
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(notify_path)
        listener.settimeout(10)
        env = {"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "200000"}
        with running_daemon(tmp_path, env=env, scenario=one_gpu):
            # WHEN it reports its status once it has sampled
            status = ""
            while " GPU" not in status:
                message = listener.recv(4096).decode()
                status = next((line for line in message.splitlines() if "STATUS=" in line), "")
    # THEN the status counts the GPU in the singular
    assert status.startswith("STATUS=1 GPU, "), status


def test_sigterm_stops_cleanly_within_two_seconds(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (process, sock, _):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=2) == 0
        assert not sock.exists(), "the socket is removed on the way out"


def test_sighup_rereads_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text('interval = "0.2s"\n')
    with running_daemon(tmp_path, "--config", str(config), interval=None) as (process, sock, _):
        assert get_json(sock, "/v1/health")[1]["interval_s"] == 0.2
        config.write_text('interval = "0.5s"\nhistory = "1h"\n')
        process.send_signal(signal.SIGHUP)
        health = wait_until(
            lambda: (h := get_json(sock, "/v1/health")[1])["interval_s"] == 0.5 and h,
            "the new interval",
        )
        assert health["history"]["capacity"] == 7200 and process.poll() is None


def test_fifty_clients_polling_at_10_hz_for_10_s_all_get_answers(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (_, sock, _):
        failures: list[str] = []
        answered = [0] * 50

        def client(number: int) -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    status, _ = http_get(str(sock), "/v1/snapshot", timeout_s=5)
                except OSError as error:
                    failures.append(repr(error))
                else:
                    answered[number] += status == 200
                time.sleep(0.1)  # the pace of a client polling at 10 Hz: nothing to wait for

        threads = [threading.Thread(target=client, args=(n,)) for n in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
    assert min(answered) >= 50, answered  # about 100 each; slow CI machines poll less often


class TestClients:
    def test_status_reads_the_daemon_when_it_runs(self, tmp_path: Path) -> None:
        with running_daemon(tmp_path) as (_, sock, _):
            result = run_cli("status", "--json", "-v", env={"GPUWATCH_SOCKET": str(sock)})
        assert result.exit_code == 0
        assert '"hostname": "daemon-node"' in result.stdout
        assert f"reading GPUs from the daemon at {sock}" in result.stderr

    def test_pick_with_the_daemon_up_starts_no_driver(
        self, tmp_path: Path, fake_nvml: Callable[..., FakeNvml]
    ) -> None:
        fake = fake_nvml()
        with running_daemon(tmp_path) as (_, sock, _):
            # (--allow-busy: every GPU of the daemon's node is 40 % busy)
            result = run_cli("pick", "-n", "2", "--allow-busy", env={"GPUWATCH_SOCKET": str(sock)})
        assert result.exit_code == 0 and result.stdout.count("GPU-") == 2
        assert fake.total_calls == 0

    @pytest.mark.parametrize("socket_state", ["absent", "stale"])
    def test_clients_fall_back_to_the_driver(
        self, tmp_path: Path, fake_nvml: Callable[..., FakeNvml], socket_state: str
    ) -> None:
        fake_nvml()
        sock = tmp_path / "gpuwatch.sock"
        if socket_state == "stale":
            with socket.socket(socket.AF_UNIX) as dead:
                dead.bind(str(sock))  # bound, never listened on, then closed
        env = {"GPUWATCH_SOCKET": str(sock)}
        quiet = run_cli("status", "--json", env=env)
        assert quiet.exit_code == 0 and quiet.stderr == ""
        told = run_cli("pick", "-v", "--allow-busy", env=env)
        assert told.exit_code == 0 and "reading the driver directly" in told.stderr
        assert ("stale" if socket_state == "stale" else "no daemon socket") in told.stderr

    def test_explicit_daemon_backend_without_a_daemon_is_an_error(self, tmp_path: Path) -> None:
        result = run_cli(
            "status", "--backend", "daemon", env={"GPUWATCH_SOCKET": str(tmp_path / "none.sock")}
        )
        assert result.exit_code == 1 and "no daemon socket" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "is too short"),
        (["--interval", "soon"], "'soon' is not a duration"),
        (["--listen", "http"], "give PORT or HOST:PORT"),
        (["--backend", "cuda"], "Invalid value for '--backend'"),
        (["--bogus"], "No such option"),
        (
            ["--history", "1000d"],
            "history 1000d at one sample every 1s would keep 86,400,000 samples",
        ),
        (["--socket", ""], "Invalid value for '--socket': give a path"),
        (["--listen", ""], "Invalid value for '--listen': give [HOST:]PORT"),
        (["--config", ""], "Invalid value for '--config': give a path"),
    ],
    ids=[
        "interval-zero",
        "interval-word",
        "bad-listen",
        "bad-backend",
        "unknown-flag",
        "history-too-long",
        "empty-socket",
        "empty-listen",
        "empty-config",
    ],
)
def test_bad_flags_are_one_line_and_exit_code_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("daemon", "--sim", "2", "--socket", str(tmp_path / "s.sock"), *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_a_second_daemon_on_the_same_socket_is_refused(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (_, sock, _):
        result = run_cli("daemon", "--sim", "2", "--socket", str(sock))
    assert result.exit_code == 1
    assert result.stderr == (
        f"gpuwatch: error: another gpuwatch daemon is serving {sock}; stop it first, or run "
        "this one beside it with --socket PATH (its clients find it with "
        "GPUWATCH_SOCKET=PATH)\n"
    )


def test_a_second_simulated_daemon_runs_beside_the_first_as_the_refusal_says(
    tmp_path: Path,
) -> None:
    # GIVEN the installed `gpuwatch daemon --sim 2` serving at its own default socket
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    first = subprocess.Popen(
        [gpuwatch, "daemon", "--sim", "2"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until((tmp_path / "gpuwatch.sock").exists, "the first daemon to serve")
        # WHEN a second one is started the same way
        second = subprocess.run(
            [gpuwatch, "daemon", "--sim", "4"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # THEN it is refused in one line that names --socket PATH
        assert second.returncode == 1 and second.stderr.count("\n") == 1
        assert "stop it first, or run this one beside it with --socket PATH" in second.stderr
        # AND started as it says, it serves beside the first, and its clients find it
        beside = tmp_path / "beside.sock"
        with subprocess.Popen(
            [gpuwatch, "daemon", "--sim", "4", "--socket", str(beside)],
            env=env,
            stderr=subprocess.DEVNULL,
        ) as third:
            try:
                wait_until(beside.exists, "the second daemon to serve")
                shown = subprocess.run(
                    [gpuwatch, "status", "--json"],
                    env={**env, "GPUWATCH_SOCKET": str(beside)},
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert shown.returncode == 0, shown.stderr
                assert len(json.loads(shown.stdout)["gpus"]) == 4
            finally:
                third.terminate()
    finally:
        first.terminate()
        first.communicate(timeout=30)


class TestFaults:
    def test_a_busy_metrics_port_is_a_prompt_error_not_a_hang(self, tmp_path: Path) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            process = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gpuwatch",
                    "daemon",
                    "--sim",
                    "2",
                    "--socket",
                    str(tmp_path / "s.sock"),
                    "--listen",
                    str(port),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        assert process.returncode == 1
        assert f"cannot serve metrics on 127.0.0.1:{port}" in process.stderr

    def test_a_reload_that_fails_keeps_the_daemon_and_its_settings(self, tmp_path: Path) -> None:
        # GIVEN a daemon under systemd, and a config that now names a busy port
        config = tmp_path / "daemon.toml"
        config.write_text('interval = "0.2s"\n')
        notify_path = str(tmp_path / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener, socket.socket() as taken:
            listener.bind(notify_path)
            listener.settimeout(10)
            env = {"NOTIFY_SOCKET": notify_path}
            with running_daemon(tmp_path, "--config", str(config), interval=None, env=env) as (
                process,
                sock,
                _,
            ):
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                config.write_text(f'interval = "0.5s"\nlisten = "{taken.getsockname()[1]}"\n')
                # WHEN it is told to reload
                process.send_signal(signal.SIGHUP)
                # THEN it reloads (systemd hears RELOADING, then READY again), the reload
                # fails, and the daemon goes on with the settings it had
                heard = [listener.recv(4096).decode().splitlines()]
                while "RELOADING=1" not in heard[-1]:
                    heard.append(listener.recv(4096).decode().splitlines())
                while "READY=1" not in heard[-1]:
                    heard.append(listener.recv(4096).decode().splitlines())
                assert process.poll() is None
                assert get_json(sock, "/v1/health")[1]["interval_s"] == 0.2

    def test_a_setting_removed_from_the_config_goes_back_to_its_default(
        self, tmp_path: Path
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        config = tmp_path / "daemon.toml"
        config.write_text(f'listen = "{port}"\n')
        with running_daemon(tmp_path, "--config", str(config)) as (process, _, _):
            assert _serves_metrics(port)
            config.write_text("")
            process.send_signal(signal.SIGHUP)
            wait_until(lambda: not _serves_metrics(port), "the TCP listener to close")
            assert process.poll() is None

    def test_an_idle_client_is_let_go_and_does_not_delay_a_stop(self, tmp_path: Path) -> None:
        with running_daemon(tmp_path) as (process, sock, _):
            idle = socket.socket(socket.AF_UNIX)
            idle.connect(str(sock))
            idle.settimeout(30)
            assert idle.recv(1) == b"", "the daemon closes a connection that sends nothing"
            sleeper = socket.socket(socket.AF_UNIX)
            sleeper.connect(str(sock))
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=2) == 0
            idle.close()
            sleeper.close()

    def test_more_clients_than_it_serves_at_once_leave_it_healthy(self, tmp_path: Path) -> None:
        with running_daemon(tmp_path) as (process, sock, _):
            crowd = []
            for _ in range(200):
                connection = socket.socket(socket.AF_UNIX)
                connection.connect(str(sock))
                crowd.append(connection)
            try:
                # once the idle ones are let go, a newcomer is answered again
                health = wait_until(lambda: get_json(sock, "/v1/health")[0] == 200, "health")
                assert health and process.poll() is None
            finally:
                for connection in crowd:
                    connection.close()

    @pytest.mark.skipif(os.getuid() != 0, reason="needs root to plant another user's socket")
    def test_a_socket_planted_by_another_user_is_ignored_and_replaced(self, tmp_path: Path) -> None:
        planted = tmp_path / "gpuwatch.sock"
        squatter = socket.socket(socket.AF_UNIX)
        squatter.bind(str(planted))
        squatter.listen()
        os.chown(planted, 54321, 54321)
        try:
            with pytest.raises(DaemonUnavailableError, match="belongs to uid 54321"):
                DaemonBackend(str(planted))
            with running_daemon(tmp_path) as (_, sock, _):
                assert sock == planted and os.lstat(sock).st_uid == 0
                assert get_json(sock, "/v1/health")[0] == 200
        finally:
            squatter.close()


def _serves_metrics(port: int) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--history", "3650d", "--interval", "0.1s"], "keep at most 1,000,000"),
        (["--listen", "::1"], "write an IPv6 address in brackets"),
    ],
    ids=["history-too-long", "bare-ipv6"],
)
def test_settings_that_cannot_work_are_refused_at_once(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = run_cli("daemon", "--sim", "2", "--socket", str(tmp_path / "s.sock"), *args)
    assert result.exit_code == 2 and message in result.stderr


def test_a_daemon_that_cannot_start_leaves_the_callers_signals_alone(tmp_path: Path) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with running_daemon(tmp_path) as (_, sock, _):
        assert run_cli("daemon", "--sim", "2", "--socket", str(sock)).exit_code == 1
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


@pytest.mark.parametrize(
    ("plant", "found"),
    [
        (lambda path: path.write_text("precious\n"), "a regular file is there"),
        (lambda path: path.mkdir(), "a directory is there"),
        (lambda path: path.symlink_to("/etc"), "a symbolic link is there"),
        (os.mkfifo, "a FIFO is there"),
    ],
    ids=["file", "directory", "symlink", "fifo"],
)
def test_a_socket_path_holding_anything_but_a_socket_is_refused_and_left_alone(
    tmp_path: Path, plant: Callable[[Path], object], found: str
) -> None:
    # GIVEN something that is not a socket at the path given as --socket
    target = tmp_path / "gpuwatch.sock"
    plant(target)
    before = what_is_at(target)
    # WHEN the daemon is asked to listen there
    result = run_cli("daemon", "--sim", "2", "--socket", str(target))
    # THEN it refuses in one line with a usage error, and the thing is still there, unchanged
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and found in result.stderr
    assert what_is_at(target) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("gpuwatch.sock")] == [
        "gpuwatch.sock"
    ]


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    # GIVEN a socket nobody listens on any more (a daemon that was killed)
    stale = tmp_path / "gpuwatch.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))
    # WHEN a daemon starts there THEN it serves on that path
    with running_daemon(tmp_path) as (_, sock, _):
        assert sock == stale and get_json(sock, "/v1/health")[0] == 200


@pytest.fixture(scope="module")
def fakenvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulated driver library, built from ../shared/fakenvml."""
    sources = Path(
        os.environ.get("FAKENVML_DIR", Path(__file__).resolve().parents[3] / "shared" / "fakenvml")
    )
    if not (sources / "Makefile").is_file() or shutil.which("cc") is None:
        pytest.skip("needs ../shared/fakenvml and a C compiler")
    build = tmp_path_factory.mktemp("fakenvml")
    subprocess.run(
        ["make", "-s", "-C", str(sources), f"BUILD={build}"], check=True, capture_output=True
    )
    return build


def _sampling_up(sock: Path) -> tuple[float, bool] | None:
    """`gpuwatch_sampling_up`, and whether any GPU series is there; None before it serves."""
    try:
        _, body = http_get(str(sock), "/metrics")
    except OSError:
        return None
    families = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    return families["gpuwatch_sampling_up"][0].value, bool(families.get("gpuwatch_gpu_up"))


def test_ready_comes_after_the_first_sample_and_sampling_is_down_until_then(
    tmp_path: Path, fakenvml_dir: Path
) -> None:
    # GIVEN a driver whose first sample takes 2 s (1 s a GPU), and the daemon started under systemd
    scenario = tmp_path / "slow.txt"
    scenario.write_text(
        "gpu util=40\ngpu util=40\nlatency func=nvmlDeviceGetUtilizationRates us=1000000\n"
    )
    sock, notify_path = tmp_path / "gw.sock", str(tmp_path / "notify")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fakenvml_dir),
        "FAKENVML_SCENARIO": str(scenario),
        "NOTIFY_SOCKET": notify_path,
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(notify_path)
        listener.setblocking(False)
        command = [sys.executable, "-m", "gpuwatch", "daemon", "--backend", "nvml"]
        with subprocess.Popen([*command, "--socket", str(sock)], env=env) as process:
            try:
                # WHEN /metrics is scraped until systemd hears READY
                before_ready: list[tuple[float, bool]] = []

                def ready() -> bool:
                    if _ready(listener):
                        return True
                    assert process.poll() is None
                    if (seen := _sampling_up(sock)) is not None:
                        before_ready.append(seen)
                    return False

                wait_until(ready, "systemd to hear READY", timeout_s=100, interval_s=0.05)
                # THEN READY found a snapshot to serve; before the snapshot, sampling was down
                # with no GPU series, and never up without them
                assert get_json(sock, "/v1/snapshot")[0] == 200
                assert (0.0, False) in before_ready
                assert set(before_ready) <= {(0.0, False), (1.0, True)}
                assert _sampling_up(sock) == (1.0, True)
            finally:
                process.send_signal(signal.SIGTERM)


def _ready(listener: socket.socket) -> bool:
    try:
        return "READY=1" in listener.recv(4096).decode().splitlines()
    except BlockingIOError:
        return False


def test_a_field_a_newer_daemon_adds_is_ignored_by_the_client(tmp_path: Path) -> None:
    # GIVEN a snapshot from the daemon with fields this client does not know, at every level
    with running_daemon(tmp_path) as (_, sock, _):
        data = get_json(sock, "/v1/snapshot")[1]
    assert data["format_version"] == 1
    data["new_top_level"] = 1
    data["gpus"][0]["new_gpu_field"] = "x"
    data["processes"][0]["new_process_field"] = None
    # WHEN the client reads it THEN it reads what it knows
    snapshot = Snapshot.from_dict(data)
    assert snapshot.hostname == "daemon-node" and snapshot.processes[0].pid == 4242


def test_a_client_of_a_daemon_in_another_snapshot_format_is_told_why(tmp_path: Path) -> None:
    # GIVEN a daemon that sends snapshots in a format this client does not read
    path = str(tmp_path / "newer.sock")
    body = b'{"format_version": 2, "snapshot": {}}'
    # WHEN a client reads it THEN it is refused with the reason, and no TypeError
    with (
        answering_once(path, body),
        pytest.raises(DaemonUnavailableError, match="sends snapshots in format 2"),
    ):
        DaemonBackend(path)


def test_the_path_check_takes_nothing_or_its_kind_and_refuses_the_rest(tmp_path: Path) -> None:
    # GIVEN nothing, a directory and a file
    (tmp_path / "file").write_text("x")
    # THEN nothing is None, the right kind is what is there, and another kind is refused
    assert existing(str(tmp_path / "absent"), stat.S_IFDIR, "--lease-dir") is None
    found = existing(str(tmp_path), stat.S_IFDIR, "--lease-dir")
    assert found is not None and found.st_ino == tmp_path.stat().st_ino
    with pytest.raises(InvalidValueError, match=r"^--lease-dir .*/file: a regular file is there"):
        existing(str(tmp_path / "file"), stat.S_IFDIR, "--lease-dir")


def test_a_daemon_stopped_and_continued_serves_on_without_reloading(tmp_path: Path) -> None:
    # GIVEN a daemon serving WHEN it is stopped and continued again and again (a debugger,
    # kill -STOP; sigtimedwait may then hand back a siginfo it never filled in)
    with running_daemon(tmp_path) as (process, socket_path, _):
        seen = psutil.Process(process.pid)
        for _ in range(20):
            process.send_signal(signal.SIGSTOP)
            wait_until(lambda: seen.status() == psutil.STATUS_STOPPED, "the daemon stopped")
            process.send_signal(signal.SIGCONT)
            wait_until(lambda: seen.status() != psutil.STATUS_STOPPED, "the daemon going on")
        # THEN it still serves, and it neither stopped nor reloaded on its own
        assert get_json(socket_path, "/v1/health")[0] == 200
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert "reloaded" not in stderr


def _waiting(sock: Path) -> tuple[float, float]:
    """The node's (waiters, longest wait in seconds) as `/metrics` tells them."""
    text = http_get(str(sock), "/metrics")[1].decode()
    families = {family.name: family.samples for family in text_string_to_metric_families(text)}
    (waiters,) = families["gpuwatch_lease_waiters"]
    (longest,) = families["gpuwatch_lease_longest_wait_seconds"]
    assert set(waiters.labels) == {"hostname"}, "one series per node, no job labels"
    return waiters.value, longest.value


def test_metrics_count_the_jobs_waiting_in_line_for_gpus(tmp_path: Path, lease_dir: Path) -> None:
    line = LeaseDir(lease_dir)
    with running_daemon(tmp_path) as (_, sock, _):
        # GIVEN no job in line, THEN none is counted
        assert _waiting(sock) == (0, 0)
        # GIVEN two jobs in line for GPUs (real tickets, held by this process)
        tickets = [line.enqueue(Request(count=1), "python train.py") for _ in range(2)]
        try:
            waiters, longest_s = wait_until(
                lambda: (counted := _waiting(sock))[1] > 0 and counted, "a wait of some length"
            )
        finally:
            for ticket in tickets:
                ticket.release()
        # THEN both are counted, and the oldest has waited a while
        assert waiters == 2 and longest_s > 0
        # AND once they leave the line, it is empty again
        assert _waiting(sock) == (0, 0)
