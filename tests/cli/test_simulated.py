"""A simulated node never poses as a real one: `status` and its JSON say so, `pick` and
`select()` through a simulated daemon warn in one line, and simulated leases live apart
from real ones, in a directory per user and simulation, so users' simulations never
collide."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpuwatch
from gpuwatch.backends.auto import AutoBackend
from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.sim import SimBackend
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.models import Snapshot
from gpuwatch.paths import SIM_LEASES, sim_lease_dir
from tests.helpers.cli import run_cli
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.fake_nvml import FakeNvml
from tests.helpers.other_user import as_user, holding, other_user_ids
from tests.helpers.wait import wait_until

SIMULATED_DAEMON = "serves a simulated node"
IDLE_NODE = 'hostname = "sim-daemon"\n[[gpu]]\ncount = 2\nload = "idle"\n'


@pytest.mark.parametrize("columns", ["200", "40"], ids=["wide", "narrow"])
def test_status_says_simulated_in_its_header_however_narrow(columns: str) -> None:
    # WHEN status shows a simulated node, on a wide or a narrow terminal
    result = run_cli("status", "--sim", "2", env={"COLUMNS": columns})
    # THEN its header says so, whatever else it leaves out
    assert result.exit_code == 0, result.stderr
    header = result.stdout.splitlines()[0]
    assert header.startswith("sim-node") and "(simulated)" in header
    assert len(header) <= int(columns)


def test_status_json_says_simulated() -> None:
    result = run_cli("status", "--sim", "2", "--json")
    assert json.loads(result.stdout)["simulated"] is True


def test_a_real_node_is_not_called_simulated(fake_nvml: Callable[..., FakeNvml]) -> None:
    # GIVEN GPUs read from the driver WHEN status shows them, and as JSON
    fake_nvml()
    table = run_cli("status", "--backend", "nvml")
    document = run_cli("status", "--backend", "nvml", "--json")
    # THEN neither says simulated
    assert table.exit_code == 0, table.stderr
    assert "simulated" not in table.stdout
    assert json.loads(document.stdout)["simulated"] is False


@pytest.fixture
def own_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No lease directory named: the user's runtime directory holds simulated leases."""
    monkeypatch.delenv("GPUWATCH_LEASE_DIR")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


@pytest.fixture
def simulated_daemon(
    tmp_path: Path, own_runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A daemon serving a simulated node at the socket clients are told of; yields it."""
    (tmp_path / "daemon").mkdir()
    with running_daemon(tmp_path / "daemon", scenario=IDLE_NODE) as (_, socket_path, _):
        monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
        yield socket_path


def test_pick_through_a_simulated_daemon_warns_in_one_line(simulated_daemon: Path) -> None:
    # WHEN pick chooses through the daemon, which the user did not ask to simulate
    result = run_cli("pick")
    # THEN it says, in one line, that the GPUs are made up
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if SIMULATED_DAEMON in line]
    assert said == [
        f"gpuwatch: the daemon at {simulated_daemon} {SIMULATED_DAEMON}: its GPUs are made up "
        "and CUDA_VISIBLE_DEVICES names none of this machine's"
    ]


def test_pick_with_sim_asked_for_does_not_warn(own_runtime_dir: Path) -> None:
    result = run_cli("pick", "--sim", "4")
    assert result.exit_code == 0, result.stderr
    assert SIMULATED_DAEMON not in result.stderr


def test_select_through_a_simulated_daemon_warns_once(simulated_daemon: Path) -> None:
    # WHEN a script selects a GPU through the daemon
    with pytest.warns(RuntimeWarning, match=SIMULATED_DAEMON) as said:
        selection = gpuwatch.select(backend="daemon")
    # THEN it is warned once, and holds its lease all the same
    try:
        assert len([w for w in said if SIMULATED_DAEMON in str(w.message)]) == 1
        assert len(selection) == 1
    finally:
        selection.release()


class _GoneSimulatedDaemon(Backend):
    """A daemon that served a simulated node, and has gone away."""

    name = "daemon"
    simulation = "daemon-gone"

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        raise DaemonUnavailableError("no daemon socket at /tmp/gw.sock")

    def close(self) -> None:
        pass


def test_a_simulated_daemon_gone_is_never_stood_in_for_by_the_driver() -> None:
    # GIVEN the auto backend over a daemon that served a simulated node, and a driver
    opened: list[str] = []
    auto = AutoBackend(_GoneSimulatedDaemon(), lambda: opened.append("driver") or SimBackend(2))
    # WHEN the daemon goes away THEN no sample comes from the driver's GPUs instead
    with pytest.raises(DaemonUnavailableError, match="never stands in"):
        auto.sample()
    assert opened == [] and auto.simulation == "daemon-gone"


def test_a_simulated_daemons_leases_live_apart_and_it_shows_them(
    simulated_daemon: Path, own_runtime_dir: Path, tmp_path: Path
) -> None:
    # GIVEN a job that picked a GPU through the simulated daemon and holds it
    ready = tmp_path / "ready"
    command = [
        sys.executable,
        "-m",
        "gpuwatch",
        "pick",
        "--",
        "sh",
        "-c",
        f"touch {ready}; sleep 60",
    ]
    with holding(command, ready):
        # THEN its lease is among the user's own simulated leases, not the real ones
        leases = list((own_runtime_dir / SIM_LEASES).glob("daemon-*/*.lease"))
        assert len(leases) == 1
        # AND the daemon, which keeps its leases in the same place, shows it
        wait_until(
            lambda: get_json(simulated_daemon, "/v1/leases")[1]["leases"], "the daemon's lease"
        )


def test_simulations_of_two_files_of_one_name_are_two(tmp_path: Path) -> None:
    # GIVEN two scenario files of one name in two folders
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "node.toml").write_text('hostname = "n"\n[[gpu]]\n')
    # THEN they are two simulations, each named after its file
    first, second = (SimBackend(tmp_path / f / "node.toml").simulation for f in ("a", "b"))
    assert first != second and first and second and first.startswith("node-")
    assert SimBackend(8).simulation == "8-gpus"


def test_a_simulations_name_is_a_plain_folder_name(own_runtime_dir: Path) -> None:
    path = Path(sim_lease_dir("../../etc/x y\x1b"))
    assert path.parent == own_runtime_dir / SIM_LEASES
    assert path.name == "_.._etc_x_y_"


def test_two_users_simulations_never_collide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN another user, and each user's own runtime directory (no lease directory named)
    uid, gid = other_user_ids()
    places = {user: Path(tempfile.mkdtemp(prefix="gpuwatch-sim-")) for user in ("me", "other")}
    os.chown(places["other"], uid, gid)
    monkeypatch.delenv("GPUWATCH_LEASE_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(places["me"]))
    theirs = {**os.environ, "XDG_RUNTIME_DIR": str(places["other"])}
    quick_start = [sys.executable, "-m", "gpuwatch", "pick", "--sim", "8", "-n", "2", "--"]
    ready = tmp_path / "ready"
    try:
        # WHEN the first user's README quick start holds the two free GPUs of `--sim 8`
        with holding([*quick_start, "sh", "-c", f"touch {ready}; sleep 60"], ready):
            # THEN the second user's quick start runs as well, on the same simulated GPUs
            second = subprocess.run(
                as_user(uid, gid, *quick_start, "printenv", "CUDA_VISIBLE_DEVICES"),
                env=theirs, capture_output=True, text=True, timeout=120, check=False, cwd="/",
            )  # fmt: skip
            assert second.returncode == 0, second.stderr
            assert second.stdout.count("GPU-") == 2
            # AND the first user's own next pick still finds them held
            again = subprocess.run(
                [*quick_start, "true"], capture_output=True, text=True, timeout=120, check=False
            )
            assert again.returncode == 4 and "leased by pid" in again.stderr
    finally:
        for place in places.values():
            shutil.rmtree(place, ignore_errors=True)
