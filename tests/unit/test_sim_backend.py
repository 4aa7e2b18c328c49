"""The simulated node: deterministic, alive, and faults injected while it runs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.backends import open_backend
from gpuwatch.backends.auto import AutoBackend
from gpuwatch.backends.base import SampleScope
from gpuwatch.backends.scenario import MODELS, load_scenario, parse_sim_spec
from gpuwatch.backends.sim import SimBackend
from gpuwatch.errors import (
    DaemonUnavailableError,
    DriverNotFoundError,
    InvalidValueError,
    ScenarioError,
)
from gpuwatch.models import Snapshot
from tests.helpers.cli import FROZEN_TIME

SCENARIO = """
hostname = "lab-7"
driver_version = "550.54.15"
cuda_driver_version = "12.4"
seed = 3

[[gpu]]
model = "A100-40GB"
count = 2
load = "sine"
utilization_pct = [20, 80]
period = "30s"

[[gpu]]
model = "RTX-4090"
load = "constant"
utilization_pct = 55
unsupported = ["power_w"]

[[process]]
gpu = 2
pid = 4242
user = "alice"
command = "python train.py"
memory = "6GiB"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def replace_atomically(path: Path, text: str) -> None:
    spare = path.with_suffix(".tmp")
    spare.write_text(text)
    os.replace(spare, path)


def test_scenario_file_sets_models_processes_and_unsupported_fields(tmp_path: Path) -> None:
    backend = SimBackend(write(tmp_path, SCENARIO), clock=lambda: FROZEN_TIME)
    snapshot = backend.sample()
    assert (snapshot.hostname, snapshot.driver_version, snapshot.cuda_driver_version) == (
        "lab-7",
        "550.54.15",
        "12.4",
    )
    assert [gpu.name for gpu in snapshot.gpus] == [
        MODELS["A100-40GB"].name,
        MODELS["A100-40GB"].name,
        MODELS["RTX-4090"].name,
    ]
    rtx = snapshot.gpus[2]
    assert rtx.utilization_pct == 55 and rtx.power_w is None and rtx.fan_pct is not None
    (process,) = snapshot.processes
    assert (process.pid, process.user, process.gpu_uuid) == (4242, "alice", rtx.uuid)
    assert rtx.memory_used_bytes == process.memory_used_bytes == 6 << 30


def test_same_seed_and_time_give_the_same_snapshot(tmp_path: Path) -> None:
    path = write(tmp_path, SCENARIO)
    first = SimBackend(path, clock=lambda: FROZEN_TIME).sample()
    again = SimBackend(path, clock=lambda: FROZEN_TIME).sample()
    assert first.gpus == again.gpus


def test_load_moves_over_time() -> None:
    now = [FROZEN_TIME]
    backend = SimBackend(8, clock=lambda: now[0])
    seen = set()
    for _ in range(10):
        seen.add(tuple(gpu.utilization_pct for gpu in backend.sample().gpus))
        now[0] += 7
    assert len(seen) > 5, "a live view of a simulated node should look alive"


def test_default_node_mixes_busy_and_idle_gpus() -> None:
    snapshot = SimBackend(4, clock=lambda: FROZEN_TIME).sample()
    assert len(snapshot.gpus) == 4
    assert snapshot.gpus[3].utilization_pct == 0 and not snapshot.processes_on(3)
    assert snapshot.processes_on(0) and snapshot.gpus[0].utilization_pct >= 70
    assert len({gpu.uuid for gpu in snapshot.gpus}) == 4


def test_fault_injected_at_run_time_shows_on_that_gpu_only(tmp_path: Path) -> None:
    path = write(tmp_path, SCENARIO)
    backend = SimBackend(path, clock=lambda: FROZEN_TIME)
    assert all(gpu.ok for gpu in backend.sample().gpus)
    # WHEN the scenario gains a lost GPU while the backend runs
    replace_atomically(
        path, SCENARIO.replace('model = "RTX-4090"', 'model = "RTX-4090"\nfault = "lost"')
    )
    snapshot = backend.sample()
    # THEN that GPU reports it, the others do not, and its processes are gone
    assert [gpu.error for gpu in snapshot.gpus] == [None, None, "GPU is lost"]
    assert snapshot.processes == ()


def test_bad_edit_keeps_the_previous_scenario(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, SCENARIO)
    backend = SimBackend(path, clock=lambda: FROZEN_TIME)
    before = backend.sample()
    replace_atomically(path, "[[gpu]]\nmodel = 'nope'\n")
    assert backend.sample().gpus == before.gpus
    assert "unknown model" in caplog.text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0", "1 to 64 GPUs"),
        ("65", "1 to 64 GPUs"),
        ("four", "neither a GPU count"),
        ("/no/such/file.toml", "neither a GPU count"),
        ("٣", "1 to 64 GPUs"),
        ("9" * 5000, "1 to 64 GPUs"),
    ],
    ids=["zero", "too-many", "word", "missing-file", "arabic-indic-digit", "5000-digits"],
)
def test_bad_sim_spec_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_sim_spec(spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[gpu]\n", "not valid TOML"),
        ("", "1 to 64 GPUs"),
        ("[[gpu]]\ncolour = 'red'\n", "gpu\\[0\\]: unknown key 'colour'"),
        ("[[gpu]]\nmodel = 'Z80'\n", "gpu\\[0\\].model: unknown model 'Z80'"),
        ("[[gpu]]\nmemory_total = '80XB'\n", "gpu\\[0\\].memory_total: '80XB' is not a size"),
        ("[[gpu]]\nmemory_total = 80\n", "write a size in quotes"),
        ("[[gpu]]\nload = 'wobbly'\n", "gpu\\[0\\].load: choose one of"),
        ("[[gpu]]\nutilization_pct = [90, 10]\n", "low <= high"),
        ("[[gpu]]\nperiod = 'soon'\n", "gpu\\[0\\].period: 'soon' is not a duration"),
        ("[[gpu]]\nunsupported = ['warp_drive']\n", "not optional metrics"),
        ("[[gpu]]\ncount = 2\nuuid = 'GPU-x'\n", "cannot set uuid"),
        ("[[gpu]]\n[[process]]\ngpu = 1\npid = 3\n", "process\\[0\\].gpu: no GPU 1"),
        ("[[gpu]]\n[[process]]\ngpu = 0\n", "process\\[0\\]: pid is required"),
        ("[[gpu]]\n[[process]]\ngpu = 0\npid = 1\nkind = 'x'\n", "kind: choose compute"),
        ("seed = 'x'\n[[gpu]]\n", "seed: expected a whole number"),
    ],
    ids=[
        "bad-toml",
        "no-gpus",
        "unknown-key",
        "unknown-model",
        "bad-size",
        "unquoted-size",
        "bad-load",
        "reversed-range",
        "bad-period",
        "bad-unsupported",
        "repeated-uuid",
        "process-gpu-out-of-range",
        "process-without-pid",
        "bad-kind",
        "bad-seed",
    ],
)
def test_bad_scenario_file_names_file_entry_and_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError, match=message) as raised:
        load_scenario(path)
    assert str(raised.value).startswith(str(path))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[gpu]]\ncount = 1000000000\n", "gpu\\[0\\].count: 1000000000 is out of range"),
        ("[[gpu]]\ncount = 40\n[[gpu]]\ncount = 40\n", "gpu\\[1\\].count: 40 is out of range"),
        ("[[gpu]]\ncount = 0\n", "count: 0 is out of range: give 1 to 64"),
        ("[[gpu]]\npower_limit_w = nan\n", "power_limit_w: nan is out of range"),
        ("[[gpu]]\npower_limit_w = inf\n", "power_limit_w: inf is out of range"),
        ("[[gpu]]\npower_limit_w = -5\n", "power_limit_w: -5 is out of range"),
        ("[[gpu]]\nutilization_pct = nan\n", "utilization_pct: needs 0 <= low"),
        ("[[gpu]]\nutilization_pct = [-1, 50]\n", "utilization_pct: needs 0 <= low"),
        (
            "[[gpu]]\nmemory_total = '1GiB'\nmemory_reserved = '2GiB'\n",
            "memory_reserved: '2GiB' is out of range",
        ),
        ("[[gpu]]\nmemory_total = '0'\n", "memory_total: '0' is out of range"),
        ("[[gpu]]\nmemory_total = '" + "9" * 400 + "G'\n", "memory_total: .* is too large"),
        ("[[gpu]]\nperiod = '0.001s'\n", "period: give 100ms to 24h"),
        ("[[gpu]]\nperiod = '9999999999'\n", "period: .* is too long"),
        ("seed = -1\n[[gpu]]\n", "seed: -1 is out of range"),
        ("[[gpu]]\n[[process]]\ngpu = 0\npid = -4\n", "pid: -4 is out of range"),
        ("[[gpu]]\n[[process]]\ngpu = 0\npid = 99999999\n", "pid: 99999999 is out of range"),
        (
            "[[gpu]]\n[[process]]\ngpu = 0\npid = 4\nmemory = ['6GiB', '2GiB']\n",
            "memory: write \\[low, high\\], the lower first",
        ),
        (
            "[[gpu]]\nuuid = 'GPU-a'\n[[gpu]]\nuuid = 'GPU-a'\n",
            "two GPUs have the same uuid",
        ),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
        ("[[gpu]]\nuuid = 'GPU-0,GPU-1'\n", 'uuid: write "GPU-..." of letters'),
        ("[[gpu]]\nuuid = 'GPU-\\u001b[2J'\n", 'uuid: write "GPU-..." of letters'),
        ("[[gpu]]\npci_bus_id = '00:18 0'\n", "pci_bus_id: write letters"),
    ],
    ids=[
        "count-billion",
        "count-over-64-in-all",
        "count-zero",
        "power-nan",
        "power-inf",
        "power-negative",
        "utilization-nan",
        "utilization-negative",
        "reserved-above-total",
        "total-zero",
        "size-400-digits",
        "period-too-short",
        "period-too-long",
        "seed-negative",
        "pid-negative",
        "pid-above-pid-max",
        "memory-reversed",
        "duplicate-uuid",
        "deeply-nested",
        "uuid-with-comma",
        "uuid-with-escape",
        "bus-id-with-space",
    ],
)
def test_out_of_range_scenario_values_are_refused_naming_them(
    tmp_path: Path, text: str, message: str
) -> None:
    # GIVEN a scenario with one value out of its range
    path = write(tmp_path, text)
    # WHEN it is loaded THEN one error names the entry and key, never a crash or a hang
    with pytest.raises(ScenarioError, match=message) as raised:
        load_scenario(path)
    assert str(raised.value).startswith(str(path)) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda path: path.write_bytes(bytes(range(256)) * 8), "not UTF-8 text"),
        (lambda path: path.write_text("# x\n" * 300_000), "larger than 1024KiB"),
        (os.mkfifo, "not a regular file"),
        (lambda path: path.symlink_to("/dev/zero"), "not a regular file"),
    ],
    ids=["binary", "oversized", "fifo", "device"],
)
def test_a_file_that_is_not_a_scenario_is_refused_at_once(
    tmp_path: Path, make: Callable[[Path], object], message: str
) -> None:
    # GIVEN a file a scenario cannot be read from (a FIFO would block a plain open())
    path = tmp_path / "node.toml"
    make(path)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_open_backend_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWATCH_SIM", "3")
    with open_backend() as backend:
        assert backend.name == "sim" and len(backend.sample().gpus) == 3


def test_open_backend_sim_kind_defaults_to_four_gpus() -> None:
    with open_backend("sim") as backend:
        assert len(backend.sample().gpus) == 4


@pytest.mark.parametrize(
    ("kind", "sim", "message"),
    [("gpu", None, "unknown backend"), ("nvml", "2", "cannot go with --backend nvml")],
    ids=["unknown-kind", "nvml-with-sim"],
)
def test_open_backend_refuses_contradictions(kind: str, sim: str | None, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message):
        open_backend(kind, sim)


class _GoneDaemon(SimBackend):
    """A daemon of real GPUs that answers until `gone`, as one that restarts or hangs."""

    name = "daemon"
    socket_path = "/run/gpuwatch/gpuwatch.sock"
    gone = False

    def __init__(self, gpus: int) -> None:
        super().__init__(gpus)
        self.simulation = None  # as the daemon of a real node is

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        if self.gone:
            raise DaemonUnavailableError("no daemon socket at /run/gpuwatch/gpuwatch.sock")
        return super().sample(scope)


def test_auto_reads_the_driver_while_the_daemon_is_away_and_the_daemon_again_later() -> None:
    # GIVEN the auto backend reading a daemon (2 GPUs), with a driver (3 GPUs) to stand in
    now = [0.0]
    daemon = _GoneDaemon(2)
    told: list[str] = []
    source = AutoBackend(daemon, lambda: SimBackend(3), on_lost=told.append, clock=lambda: now[0])
    assert len(source.sample().gpus) == 2
    # WHEN the daemon goes away
    daemon.gone = True
    # THEN the driver answers, told once; the daemon is asked again later, and answers
    assert [len(source.sample().gpus) for _ in range(3)] == [3, 3, 3]
    assert len(told) == 1 and told[0].startswith("lost the daemon (no daemon socket")
    daemon.gone = False
    assert len(source.sample().gpus) == 3  # too soon to ask the daemon again
    now[0] += 60
    assert len(source.sample().gpus) == 2


class _DaemonWithHistory(_GoneDaemon):
    def recent_utilization_pct(self, window_s: float) -> dict[str, float]:
        return {"GPU-busy-a-minute-ago": 80.0}


def test_auto_passes_on_the_daemons_recent_utilization_only_while_the_daemon_answers() -> None:
    # GIVEN the auto backend over a daemon that keeps a history
    daemon = _DaemonWithHistory(2)
    source = AutoBackend(daemon, lambda: SimBackend(3), clock=lambda: 0.0)
    source.sample()
    # THEN a pick asking through it sees the daemon's figures (a GPU busy a minute ago is busy)
    assert source.recent_utilization_pct(60) == {"GPU-busy-a-minute-ago": 80.0}
    # AND while the driver stands in for a lost daemon there is no history to give
    daemon.gone = True
    source.sample()
    assert source.recent_utilization_pct(60) == {}


def test_auto_without_a_driver_says_the_daemon_is_unavailable() -> None:
    # GIVEN the auto backend, whose daemon went away, on a machine without a driver
    daemon = _GoneDaemon(2)
    daemon.gone = True

    def no_driver() -> SimBackend:
        raise DriverNotFoundError("NVIDIA driver not found")

    source = AutoBackend(daemon, no_driver)
    # WHEN it samples, THEN it raises what a waiting job waits out
    with pytest.raises(DaemonUnavailableError, match=r"no daemon socket.*; and NVIDIA driver"):
        source.sample()


def test_processes_have_the_sm_utilization_of_their_scenario(tmp_path: Path) -> None:
    # GIVEN a busy GPU shared by a process with a fixed sm and two without; a MIG GPU
    path = write(
        tmp_path,
        'hostname = "n"\n'
        '[[gpu]]\nload = "constant"\nutilization_pct = 90\n'
        '[[gpu]]\nmodel = "A100-80GB"\nmig = ["3g.40gb"]\n'
        "[[process]]\ngpu = 0\npid = 10\nsm = 40\n"
        "[[process]]\ngpu = 0\npid = 11\n"
        "[[process]]\ngpu = 0\npid = 12\n"
        "[[process]]\ngpu = 1\nmig = 0\npid = 13\n",
    )
    snapshot = SimBackend(path, clock=lambda: FROZEN_TIME).sample()
    sm = {p.pid: p.sm_util_pct for p in snapshot.processes}
    # THEN the fixed one keeps it, the others share the GPU evenly, the MIG one has none
    assert sm[10] == 40
    assert sm[11] == sm[12] == round(snapshot.gpus[0].utilization_pct / 3)  # type: ignore[operator]
    assert sm[13] is None


@pytest.mark.parametrize("value", ["101", "-1", '"40"'], ids=["above-100", "negative", "text"])
def test_an_sm_out_of_range_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[[gpu]]\n[[process]]\ngpu = 0\npid = 10\nsm = {value}\n")
    with pytest.raises(ScenarioError, match=r"process\[0\]\.sm"):
        load_scenario(path)
