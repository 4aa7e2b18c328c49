"""A daemon that serves a simulated node says so (`/v1/health`, `gpuwatch_simulated 1`) and
never takes the system's socket unless `--socket` names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch import paths
from gpuwatch.backends.daemon_client import http_get
from gpuwatch.backends.sim import SimBackend
from gpuwatch.errors import DaemonError
from gpuwatch.leases.directory import LeaseDir, Unleased
from tests.helpers.daemon import get_json, running_daemon, scrape
from tests.helpers.wait import wait_until


def test_a_simulated_daemon_says_so_in_its_health_and_metrics(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as (_, socket_path, _):
        # WHEN its health and metrics are read
        health = get_json(socket_path, "/v1/health")[1]
        metrics = http_get(str(socket_path), "/metrics")[1].decode()
    # THEN both say the node is simulated
    assert health["simulated"] is True and health["backend"] == "sim"
    (simulated,) = [
        f for f in text_string_to_metric_families(metrics) if f.name.endswith("simulated")
    ]
    assert [(s.labels, s.value) for s in simulated.samples] == [({"hostname": "daemon-node"}, 1.0)]


def test_a_real_nodes_metrics_say_it_is_not_simulated() -> None:
    # GIVEN the metrics of a view of a real node (as the driver's daemon takes it)
    snapshot = SimBackend(1).sample()
    # THEN `gpuwatch_simulated` is 0 there
    assert [s.value for s in scrape(snapshot, [])["gpuwatch_simulated"]] == [0.0]


def test_daemon_sim_listens_in_the_users_own_place_never_systemds(tmp_path: Path) -> None:
    # GIVEN systemd's runtime directory (the system socket's) and the user's own
    system, own = tmp_path / "system", tmp_path / "own"
    system.mkdir()
    own.mkdir(mode=0o700)
    env = {**os.environ, "RUNTIME_DIRECTORY": str(system), "XDG_RUNTIME_DIR": str(own)}
    # WHEN `gpuwatch daemon --sim 2` starts without --socket
    argv = [sys.executable, "-m", "gpuwatch", "daemon", "--sim", "2", "--interval", "0.2s"]
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) as daemon:
        try:
            # THEN it listens in the user's own directory, and says how clients find it
            wait_until(lambda: (own / "gpuwatch.sock").exists() or daemon.poll(), "the socket")
            assert not (system / "gpuwatch.sock").exists()
        finally:
            daemon.send_signal(signal.SIGTERM)
            _, log = daemon.communicate(timeout=30)
    assert f"GPUWATCH_SOCKET={own / 'gpuwatch.sock'}" in log


def test_a_simulated_daemon_of_root_never_takes_the_system_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN root, without a runtime directory in its environment (cron, ssh without logind)
    if os.geteuid() != 0:
        pytest.skip("plays root, whose system directory must be root's own")
    for variable in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(paths, "SYSTEM_DIR", str(tmp_path / "system"))
    monkeypatch.setattr(paths, "SYSTEM_SOCKET", str(tmp_path / "system" / "gpuwatch.sock"))
    monkeypatch.setattr(paths, "_user_run_dir", lambda: str(tmp_path / "user"))
    # WHEN a daemon asks where to listen THEN a real node's takes the system's socket, and a
    # simulated node's root's own place
    assert paths.daemon_socket_path() == paths.SYSTEM_SOCKET
    assert paths.daemon_socket_path(simulated=True) == str(tmp_path / "user" / "gpuwatch.sock")


def test_where_another_user_took_a_users_own_places_gpuwatch_says_so_never_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no runtime directory, and /run/user/UID and /tmp/gpuwatch-UID not this user's alone
    # (open to everyone, as one another user made)
    for variable in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR", "GPUWATCH_LEASE_DIR"):
        monkeypatch.delenv(variable, raising=False)
    for name in ("run", "tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(0o777)
    monkeypatch.setattr(paths, "_user_run_dir", lambda: str(tmp_path / "run"))
    monkeypatch.setattr(paths, "_user_tmp_dir", lambda: str(tmp_path / "tmp"))
    # WHEN a simulated daemon asks where to listen THEN it is told why not, and what to do
    with pytest.raises(DaemonError, match=r"tmp is not this user's alone.*give --socket PATH"):
        paths.daemon_socket_path(simulated=True)
    # AND a job picked on a simulated node is told that it holds no lease, and why
    said: list[str] = []
    lease_dir = LeaseDir.for_job(say=said.append, simulation="2")
    assert isinstance(lease_dir, Unleased)
    assert said == [
        "picking without a lease, so another job may be given the same GPU: no directory of "
        f"this user's own for simulated leases: {tmp_path / 'tmp'} is not this user's alone; "
        "remove it, or set XDG_RUNTIME_DIR or GPUWATCH_LEASE_DIR"
    ]
    # AND nothing was made anywhere else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []
