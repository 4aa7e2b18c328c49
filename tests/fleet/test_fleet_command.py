"""`gpuwatch fleet` as users run it: --once, --json, bad values, and the real program in tmux."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.fleet.scrape import DEFAULT_PORT
from tests.helpers.cli import run_cli
from tests.helpers.fleet.document import GPU_KEYS, MIG_KEYS, NODE_KEYS, PROCESS_KEYS
from tests.helpers.fleet.endpoints import Endpoint
from tests.helpers.fleet.servers import Reply, always, fixture, serving
from tests.helpers.tmux import GPUWATCH, Tmux


def test_once_prints_the_totals_and_a_line_per_node_within_80_columns() -> None:
    result = run_cli("fleet", "--sim", "20", "--once")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("20 nodes: 17 up, 3 down")
    assert lines[1].split()[:3] == ["NODE", "FREE", "MOST-FREE"]
    table, why = lines[2:22], lines[22:]
    assert sorted(line.split()[0] for line in table) == [f"node-{k:02d}" for k in range(1, 21)]
    assert all(len(line) <= 80 for line in table)
    assert any(line.endswith("stale") for line in table) and any(
        line.endswith("down") for line in table
    )
    # AND below the table, why each node that is not up is not
    assert len(why) == 3 and all(line.startswith("node-") for line in why)
    assert sum(": down: connection refused" in line for line in why) == 2


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


GPUWATCH_PAGE = fixture("gpuwatch_node.prom")


def test_a_node_behind_basic_auth_is_down_with_why_below_the_table() -> None:
    # GIVEN a node whose /metrics wants a password, asked without one
    unauthorized = Reply(b"Unauthorized\n", status=401, headers={"WWW-Authenticate": "Basic"})
    with serving(always(unauthorized)) as url:
        address = url.removeprefix("http://")
        # WHEN the table is printed once
        result = run_cli("fleet", "--node", address, "--once")
    # THEN the node is down, and the line below the table says why and what to give
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"{address}: down: HTTP 401: the node asks for credentials (--user with "
        "--password-file, or --token-file)"
    )


def test_a_bare_host_that_refuses_names_the_port_tried() -> None:
    # GIVEN nothing listening on this machine at gpuwatch's port
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", DEFAULT_PORT)) == 0:
            pytest.skip(f"something listens on 127.0.0.1:{DEFAULT_PORT} here")
    # WHEN where is given the host alone
    result = run_cli("where", "-v", "--node", "127.0.0.1")
    # THEN the node is down, saying which port was tried, and which others an exporter uses
    assert result.exit_code == ExitCode.NOT_ENOUGH_GPUS
    assert (
        f"gpuwatch: 127.0.0.1: down: connection refused at 127.0.0.1:{DEFAULT_PORT} (no port "
        f"given: {DEFAULT_PORT} is a gpuwatch daemon's; dcgm-exporter's is 9400" in result.stderr
    )


def test_an_ipv6_address_left_open_is_one_line_and_exit_2() -> None:
    result = run_cli("where", "--node", "http://[::1")
    assert result.exit_code == ExitCode.USAGE
    assert "IPv6 address in brackets" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_credentials_over_plain_http_are_warned_of_once(tmp_path: Path) -> None:
    # GIVEN a token, and two nodes over plain http
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with serving(always(Reply(GPUWATCH_PAGE))) as url:
        address = url.removeprefix("http://")
        # WHEN where reads them
        result = run_cli(
            "where", "--node", address, "--node", f"{url}/other", "--token-file", str(token)
        )
    # THEN the token is said to go in clear text, once, on stderr
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert warnings == [
        f"gpuwatch: warning: credentials go in clear text over http:// to http://{address}"
        "/metrics and 1 more: anyone on the way can read them; use https"
    ]


def test_json_has_each_gpus_bus_id_processes_and_mig_devices() -> None:
    # GIVEN a gpuwatch daemon's page: GPU 1 runs alice's process, GPU 2 is split
    with serving(always(Reply(GPUWATCH_PAGE))) as url:
        # WHEN its fleet document is printed
        result = run_cli("fleet", "--node", url.removeprefix("http://"), "--json")
    # THEN each GPU has its PCI bus id, its processes and its MIG devices
    assert result.exit_code == 0, result.stderr
    (node,) = json.loads(result.stdout)["nodes"]
    gpus = node["gpus"]
    assert all(set(g) == GPU_KEYS for g in gpus)
    assert gpus[0]["pci_bus_id"] == "00000000:18:00.0"
    (process,) = gpus[1]["processes"]
    assert set(process) == PROCESS_KEYS
    assert (process["pid"], process["user"], process["kind"]) == (4242, "alice", "compute")
    assert gpus[2]["mig_enabled"] is True and gpus[2]["mig_devices"]
    assert all(set(m) == MIG_KEYS and m["uuid"].startswith("MIG-") for m in gpus[2]["mig_devices"])
    assert gpus[0]["mig_devices"] == [] and gpus[0]["processes"] == []
