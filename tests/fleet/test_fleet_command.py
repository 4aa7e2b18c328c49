"""`gpuwatch fleet` as users run it: --once, --json, bad values, and the real program in tmux."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.cli import run_cli
from tests.helpers.fleet.document import GPU_KEYS, NODE_KEYS
from tests.helpers.fleet.endpoints import Endpoint
from tests.helpers.tmux import GPUWATCH, Tmux


def test_once_prints_the_totals_and_a_line_per_node_within_80_columns() -> None:
    result = run_cli("fleet", "--sim", "20", "--once")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("20 nodes: 17 up, 3 down")
    assert lines[1].split()[:3] == ["NODE", "FREE", "MOST-FREE"]
    assert sorted(line.split()[0] for line in lines[2:]) == [f"node-{k:02d}" for k in range(1, 21)]
    assert all(len(line) <= 80 for line in lines)
    assert any(line.endswith("stale") for line in lines) and any(
        line.endswith("down") for line in lines
    )


def test_json_is_one_document_with_null_for_what_a_source_does_not_know() -> None:
    result = run_cli("fleet", "--sim", "20", "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)  # one document, not lines of them
    assert set(document) == {"taken_at", "source", "nodes"}
    assert document["source"] == "simulated (20 nodes)"
    nodes = document["nodes"]
    assert [n["node"] for n in nodes] == [f"node-{k:02d}" for k in range(1, 21)]
    assert all(set(n) == NODE_KEYS for n in nodes)
    assert all(set(g) == GPU_KEYS for n in nodes for g in n["gpus"])
    down = [n for n in nodes if not n["up"] and not n["gpus"]]
    assert down and all(n["age_s"] is None and n["error"] for n in down)
    dcgm = [n for n in nodes if n["exporter"] == "dcgm"]
    assert dcgm and all(g["leases_exclusive"] is None for n in dcgm for g in n["gpus"])
    gpuwatch_nodes = [n for n in nodes if n["exporter"] == "gpuwatch" and n["gpus"]]
    assert all(isinstance(g["leases_shared"], int) for n in gpuwatch_nodes for g in n["gpus"])


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--sim", "0"], "out of range"),
        (["--sim", "many"], "'--sim'"),
        (["--sim", "20000"], "out of range"),
        (["--sim", "2", "--interval", "soon"], "'soon' is not a duration"),
        (["--sim", "2", "--interval", "10ms"], "too short"),
        (["--sim", "2", "--once", "--interval", "2"], "not with --once or --json"),
        (["--sim", "2", "--idle-after", "-1"], "not a duration"),
        ([], "no fleet to read"),
        (["--prometheus", "prom:9090"], "give http(s)://HOST:PORT"),
        (["--node", "gpu-01", "--timeout", "soon"], "'soon' is not a duration"),
        (["--sim", "2", "--colour"], "No such option"),
    ],
    ids=[
        "sim-zero",
        "sim-word",
        "sim-too-many",
        "interval-word",
        "interval-too-short",
        "interval-with-once",
        "idle-after",
        "no-source",
        "prometheus-not-a-url",
        "timeout-word",
        "unknown",
    ],
)
def test_bad_values_are_one_line_usage_errors(
    args: list[str], complaint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no fleet set in the environment or a config file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("GPUWATCH_PROMETHEUS", raising=False)
    result = run_cli("fleet", *args)
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert result.stderr.startswith("gpuwatch: error:") and complaint in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


@pytest.mark.parametrize("mode", [[], ["--once"], ["--json"]], ids=["screen", "once", "json"])
def test_a_source_that_cannot_be_read_is_one_line_and_exit_6_before_any_screen(
    mode: list[str], refusing_endpoint: Endpoint
) -> None:
    result = run_cli("fleet", "--prometheus", f"http://{refusing_endpoint.address}", *mode)
    assert result.exit_code == ExitCode.REMOTE, result.stderr
    assert result.stderr.startswith("gpuwatch: error: Prometheus at http://127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "\x1b[" not in result.stdout, "no screen was drawn"


def test_a_node_that_refuses_is_down_in_the_json_not_an_error(
    refusing_endpoint: Endpoint,
) -> None:
    address = refusing_endpoint.address
    result = run_cli("fleet", "--node", address, "--json")
    assert result.exit_code == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["node"] == address and node["up"] is False and node["gpus"] == []
    assert node["error"] and node["age_s"] is None


def test_help_teaches_with_examples() -> None:
    result = run_cli("fleet", "--help")
    assert result.exit_code == 0
    assert "gpuwatch fleet --sim 20 --once" in result.stdout
    for option in ("--sim", "--once", "--json", "--interval", "--idle-after"):
        assert option in result.stdout


@pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("GPUWATCH_REQUIRE_TMUX"),
    reason="needs tmux (apt-get install tmux)",
)
def test_the_installed_command_in_a_real_terminal(lease_dir: Path) -> None:
    # GIVEN the installed `gpuwatch fleet --sim 20` in an 80x24 terminal
    command = shlex.join([GPUWATCH, "fleet", "--sim", "20", "--interval", "1"])
    terminal = Tmux(f"GPUWATCH_LEASE_DIR={shlex.quote(str(lease_dir))} {command}", (80, 24))
    try:
        # WHEN the first read is drawn THEN the totals and the nodes show
        screen = terminal.wait_for("20 nodes: 17 up")
        assert "node-" in screen and "FREE" in screen
        # AND u shows the users, and u again the nodes
        terminal.press("u")
        terminal.wait_for("GPU-MEM")
        terminal.press("u")
        terminal.wait_for("MOST-FREE")
        # AND Enter shows the selected node's GPU cards, Esc goes back
        terminal.press("Enter")
        terminal.wait_for("driver 580.95.05")
        terminal.press("Escape")
        terminal.wait_for("MOST-FREE")
        # AND q quits cleanly
        terminal.press("q")
        screen = terminal.wait_for("EXIT=")
        assert "EXIT=0" in screen
        assert "Traceback" not in screen
    finally:
        terminal.close()
