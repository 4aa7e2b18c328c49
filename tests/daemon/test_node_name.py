"""`--node-name`: the node's name in every series and in the API, whatever the host is called."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from tests.helpers.cli import run_cli
from tests.helpers.daemon import SCENARIO, get_json, running_daemon
from tests.helpers.daemon_net import tcp_daemon

pytestmark = pytest.mark.slow

# A container's host name, which the daemon must never give out for the node's.
IN_A_CONTAINER = SCENARIO.replace('hostname = "daemon-node"', 'hostname = "3f9c2a7b1e44"')


def hostnames_of_every_sample(text: str) -> dict[str, set[str | None]]:
    """Metric family -> the `hostname` labels of its samples (`None` where one has none)."""
    return {
        family.name: {sample.labels.get("hostname") for sample in family.samples}
        for family in text_string_to_metric_families(text)
        if family.samples
    }


def test_every_series_over_tcp_carries_the_node_name_not_the_containers(tmp_path: Path) -> None:
    # GIVEN a daemon in a container, told the node's name
    with tcp_daemon(tmp_path, "--node-name", "rack3-gpu07", scenario=IN_A_CONTAINER) as daemon:
        # WHEN Prometheus scrapes it
        reply = daemon.get("/metrics")
        snapshot = get_json(daemon.socket_path, "/v1/snapshot")[1]
    # THEN every series, the daemon's own and the training ones included, names the node
    by_family = hostnames_of_every_sample(reply.body)
    assert {"gpuwatch_memory_free_bytes", "gpuwatch_sampling_up", "gpuwatch_build_info"} <= set(
        by_family
    )
    assert "gpuwatch_daemon_process_cpu_seconds" in by_family
    assert "gpuwatch_torch_reports_skipped" in by_family
    assert {name: {"rack3-gpu07"} for name in by_family} == by_family
    # AND the API names the node so too (status, tui)
    assert snapshot["hostname"] == "rack3-gpu07"


def test_without_a_node_name_the_source_names_the_node(tmp_path: Path) -> None:
    with running_daemon(tmp_path, scenario=IN_A_CONTAINER) as (_, sock, _):
        status, body = http_get(str(sock), "/metrics")
    assert status == 200
    assert set().union(*hostnames_of_every_sample(body.decode()).values()) == {"3f9c2a7b1e44"}


@pytest.mark.parametrize(
    ("flag", "env", "in_file", "named"),
    [
        (None, "from-env", None, "from-env"),
        ("from-flag", "from-env", None, "from-flag"),
        (None, None, "from-file", "from-file"),
        (None, "from-env", "from-file", "from-env"),
        ("from-flag", None, "from-file", "from-flag"),
        (None, "", None, "daemon-node"),
    ],
    ids=["env", "flag-over-env", "file", "env-over-file", "flag-over-file", "empty-env-unset"],
)
def test_the_flag_wins_over_the_environment_which_wins_over_the_config_file(
    tmp_path: Path, flag: str | None, env: str | None, in_file: str | None, named: str
) -> None:
    # GIVEN a node name in some of the flag, GPUWATCH_NODE_NAME and the config file
    config = tmp_path / "daemon.toml"
    config.write_text(f'node_name = "{in_file}"\n' if in_file else "")
    args = ["--config", str(config), *(["--node-name", flag] if flag else [])]
    environment = {} if env is None else {"GPUWATCH_NODE_NAME": env}
    # WHEN the daemon starts
    with running_daemon(tmp_path, *args, env=environment) as (_, sock, _):
        _, body = http_get(str(sock), "/metrics")
        snapshot = get_json(sock, "/v1/snapshot")[1]
    # THEN the node has the name of the one that wins
    assert set().union(*hostnames_of_every_sample(body.decode()).values()) == {named}
    assert snapshot["hostname"] == named


BAD_NAMES = [
    ("gpu 07", "no spaces or control characters"),
    ("gpu\x1b[2J07", "no spaces or control characters"),
    ("gpu\n07", "no spaces or control characters"),
    ("g" * 254, "254 characters; at most 253"),
    ("", "give a name"),
]
BAD_IDS = ["space", "escape", "newline", "too-long", "empty"]


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_IDS)
def test_a_bad_node_name_on_the_command_line_is_one_line_and_exit_2(
    tmp_path: Path, name: str, message: str
) -> None:
    result = run_cli("daemon", "--sim", "2", "--socket", str(tmp_path / "s"), "--node-name", name)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "--node-name" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("name", "message"), BAD_NAMES[:4], ids=BAD_IDS[:4])
def test_a_bad_node_name_in_the_environment_is_refused_alike(
    tmp_path: Path, name: str, message: str
) -> None:
    socket_path = str(tmp_path / "s")
    result = run_cli(
        "daemon", "--sim", "2", "--socket", socket_path, env={"GPUWATCH_NODE_NAME": name}
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_IDS)
def test_a_bad_node_name_in_the_config_file_names_the_file(
    tmp_path: Path, name: str, message: str
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(f"node_name = {json.dumps(name)}\n")  # JSON's escapes are TOML's
    result = run_cli(
        "daemon", "--sim", "2", "--socket", str(tmp_path / "s"), "--config", str(config)
    )
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert str(config) in result.stderr and message in result.stderr
