"""`gpuwatch status` through the same main() as the console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pynvml
import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import GpuSample, ProcessUsage, Snapshot
from tests.helpers.cli import run_cli
from tests.helpers.fake_nvml import FakeNvml


def test_table_shows_every_gpu_and_its_processes() -> None:
    result = run_cli("status", "--sim", "4")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("sim-node")
    for index in range(4):
        assert any(line.startswith(f"[{index}] NVIDIA H100 80GB HBM3 |") for line in lines)
    assert "python train.py --rank 0" in result.stdout
    assert "alice" in result.stdout and "\x1b[" not in result.stdout, "no colour off a terminal"


def test_color_always_colours_and_no_color_is_honoured() -> None:
    assert "\x1b[" in run_cli("status", "--sim", "2", "--color", "always").stdout
    assert "\x1b[" not in run_cli("status", "--sim", "2", env={"NO_COLOR": "1"}).stdout


def test_json_keys_are_the_model_field_names_and_bytes_are_integers() -> None:
    result = run_cli("status", "--sim", "4", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    jobs = {"jobs", "jobs_error", "allocated_idle_window_s"}
    assert (
        set(data) == {field.name for field in msgspec.structs.fields(Snapshot)} | {"leases"} | jobs
    )
    per_gpu = {"job_id", "allocated_idle_s", "holders_unknown"}
    assert {field.name for field in msgspec.structs.fields(GpuSample)} | per_gpu == set(
        data["gpus"][0]
    )
    assert {field.name for field in msgspec.structs.fields(ProcessUsage)} == set(
        data["processes"][0]
    )
    assert isinstance(data["gpus"][0]["memory_free_bytes"], int)
    assert isinstance(data["processes"][0]["memory_used_bytes"], int)
    assert Snapshot.from_dict(data).gpus[0].index == 0


def test_watch_json_streams_one_object_per_line() -> None:
    result = run_cli("status", "--sim", "2", "--json", "--watch", "50ms", "--count", "3")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    taken = [json.loads(line)["taken_at"] for line in lines]
    assert taken == sorted(taken) and len(set(taken)) == 3


@pytest.mark.parametrize("output", [["--json"], []], ids=["json", "table"])
def test_a_reader_that_stops_reading_ends_the_watch_quietly(output: list[str]) -> None:
    # GIVEN `gpuwatch status --watch` streaming into a pipe
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "status", "--sim", "2", "--watch", "50ms", *output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdout.readline()
    # WHEN the reader goes away, as `| head -1` does
    process.stdout.close()
    _, stderr = process.communicate(timeout=60)
    # THEN status ends with success and says nothing: `set -o pipefail` scripts go on
    assert (process.returncode, stderr) == (ExitCode.OK, b"")


def test_watch_table_off_a_terminal_prints_tables_one_after_another() -> None:
    result = run_cli("status", "--sim", "2", "--watch", "50ms", "--count", "2")
    assert result.exit_code == 0
    assert result.stdout.count("[1] NVIDIA") == 2 and "\x1b[2J" not in result.stdout


def test_scenario_file_with_a_lost_gpu_shows_it_beside_the_others(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[[gpu]]\ncount = 2\n[[gpu]]\nfault = 'lost'\n")
    result = run_cli("status", "--sim", str(path))
    assert result.exit_code == 0
    assert "[2] NVIDIA H100 80GB HBM3 | error: GPU is lost" in result.stdout
    assert "[1] NVIDIA H100 80GB HBM3 |   0.0 /  79.6 GiB" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sim", "0"], "--sim 0: a simulated node has 1 to 64 GPUs"),
        (["--sim", "lots"], "--sim lots: neither a GPU count"),
        (["--watch", "soon"], "Invalid value for '--watch': 'soon' is not a duration"),
        (["--watch", "0"], "is too short"),
        (["--count", "2"], "--count needs --watch"),
        (["--backend", "cuda"], "Invalid value for '--backend'"),
        (["--backend", "nvml", "--sim", "2"], "cannot go with --backend nvml"),
        (["--frobnicate"], "No such option"),
    ],
    ids=[
        "sim-zero",
        "sim-word",
        "watch-word",
        "watch-zero",
        "count-alone",
        "bad-backend",
        "nvml-and-sim",
        "unknown-option",
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    result = run_cli("status", *args)
    assert result.exit_code == ExitCode.USAGE == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("gpuwatch: error: ")
    assert message in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [("[[gpu]\n", "not valid TOML"), ("[[gpu]]\nmodel = 'Z80'\n", "unknown model 'Z80'")],
    ids=["bad-toml", "bad-model"],
)
def test_bad_scenario_file_is_one_line_and_exit_code_2(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = run_cli("status", "--sim", str(path))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert str(path) in result.stderr and message in result.stderr


def test_no_driver_is_exit_code_3_with_a_hint(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(init_error=pynvml.NVMLError_LibraryNotFound)
    result = run_cli("status")
    assert result.exit_code == ExitCode.NO_GPU == 3
    assert result.stderr == (
        "gpuwatch: error: NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded); "
        "try --sim 4 to explore gpuwatch without a GPU\n"
    )


def test_nvml_backend_renders_what_the_driver_reports(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake = fake_nvml()
    result = run_cli("status", "--json", "--backend", "nvml")
    data = json.loads(result.stdout)
    assert [gpu["uuid"] for gpu in data["gpus"]] == [gpu.uuid for gpu in fake.gpus]
    assert data["gpus"][0]["power_w"] == 300.0


def test_environment_chooses_the_backend() -> None:
    result = run_cli("status", "--json", env={"GPUWATCH_BACKEND": "sim", "GPUWATCH_SIM": "3"})
    assert len(json.loads(result.stdout)["gpus"]) == 3


def test_version_and_help() -> None:
    from gpuwatch import __version__

    assert run_cli("--version").stdout == f"gpuwatch, version {__version__}\n"
    help_text = run_cli("status", "--help").stdout
    assert "Examples:" in help_text and "--watch SECONDS" in help_text


def test_leases_show_who_holds_which_gpu(tmp_path: Path) -> None:
    # GIVEN GPU 2 of a simulated node leased to this process
    lease_dir = LeaseDir(tmp_path)
    gpu = SimBackend(4).sample().gpus[2]
    with lease_dir.locked():
        held = lease_dir.claim(gpu, mem_bytes=10 << 30, command="python train.py")
    env = {"GPUWATCH_LEASE_DIR": str(tmp_path)}
    try:
        table = run_cli("status", "--sim", "4", env=env).stdout
        data = json.loads(run_cli("status", "--sim", "4", "--json", env=env).stdout)
    finally:
        held.release()
    # THEN the table says so under GPU 2, and the JSON lists the lease
    below_gpu2 = table.split("[2] ")[1].split("[3] ")[0]
    assert f"leased by {held.lease.user} (pid {os.getpid()}, shared, 10.0GiB" in below_gpu2
    assert data["leases"] == [held.lease.to_dict()]


def test_verbose_says_who_could_tamper_with_the_lease_directory(lease_dir: Path) -> None:
    # GIVEN a lease directory that anyone could empty (world-writable, not sticky)
    lease_dir.mkdir()
    lease_dir.chmod(0o777)
    # WHEN status is asked to say where things come from
    result = run_cli("status", "--sim", "2", "-v")
    # THEN the GPUs are shown, and it says who could tamper with the leases; pick uses it too
    assert result.exit_code == 0, result.stderr
    assert "lets every user remove or forge leases" in result.stderr
    picked = run_cli("pick", "--sim", "2", "--allow-busy")
    assert picked.exit_code == 0 and "lets every user remove or forge leases" in picked.stderr


def test_a_watch_says_once_that_it_lost_the_daemon_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers.daemon import running_daemon
    from tests.helpers.wait import wait_until

    # GIVEN `status --watch` reading a daemon (no driver here to stand in for it)
    monkeypatch.setenv("GPUWATCH_SOCKET", str(tmp_path / "gpuwatch.sock"))
    out, err = tmp_path / "out.ndjson", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        with running_daemon(tmp_path):
            watching = subprocess.Popen(
                [sys.executable, "-m", "gpuwatch", "status", "--json", "--watch", "0.1"],
                stdout=stdout,
                stderr=stderr,
            )
            try:
                wait_until(
                    lambda: out.read_text().count("\n") >= 1,
                    "a first sample",
                    timeout_s=60,
                    interval_s=0.02,
                )
                # WHEN the daemon stops for a while, and starts again
            except BaseException:
                watching.kill()
                raise
        try:
            wait_until(
                lambda: "lost the daemon" in err.read_text(),
                "the watch to notice",
                timeout_s=60,
                interval_s=0.02,
            )
            seen = out.read_text().count("\n")
            with running_daemon(tmp_path):
                wait_until(
                    lambda: out.read_text().count("\n") > seen,
                    "a sample from the new daemon",
                    timeout_s=60,
                    interval_s=0.02,
                )
            running = watching.poll() is None
        finally:
            watching.kill()
            watching.wait()
    # THEN the watch said so in one line, and went on with the daemon back
    assert running
    assert err.read_text().count("lost the daemon") == 1, err.read_text()
    assert err.read_text().count("\n") == 1
