"""Which fleet to read: options, else GPUWATCH_PROMETHEUS, else fleet.toml; credentials from
files or the environment only; every mistake one line."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.errors import InvalidValueError
from gpuwatch.fleet.config import SourceOptions, config_path, http_options, resolved
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.scrape import ScrapeSource
from gpuwatch.fleet.source import FleetSource


def resolve(
    options: SourceOptions, env: dict[str, str], *, warn: Callable[[str], None] | None = None
) -> FleetSource:
    """The source `options` name in `env`, as a command opens it."""
    return resolved(options, env, warn=warn).source


def env_for(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path), **more}


def write_config(tmp_path: Path, text: str) -> Path:
    path = Path(config_path(env_for(tmp_path)))
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_an_explicit_option_wins_over_environment_and_file(tmp_path: Path) -> None:
    write_config(tmp_path, 'prometheus = "http://from-file:9090"\n')
    env = env_for(tmp_path, GPUWATCH_PROMETHEUS="http://from-env:9090")
    source = resolve(SourceOptions(nodes=("node1",)), env)
    assert isinstance(source, ScrapeSource) and source.description == "nodes (1)"


def test_the_environment_wins_over_the_file(tmp_path: Path) -> None:
    write_config(tmp_path, 'prometheus = "http://from-file:9090"\n')
    env = env_for(tmp_path, GPUWATCH_PROMETHEUS="http://from-env:9090")
    assert resolve(SourceOptions(), env).description == "prometheus http://from-env:9090"


@pytest.mark.parametrize(
    ("text", "description"),
    [
        (
            'prometheus = "https://prom.lab:9090/"\ntimeout = "5s"\n',
            "prometheus https://prom.lab:9090",
        ),
        ('nodes = ["node1", "node2:9400"]\n', "nodes (2)"),
    ],
    ids=["prometheus", "nodes"],
)
def test_the_config_file_sets_the_source_once(tmp_path: Path, text: str, description: str) -> None:
    write_config(tmp_path, text)
    assert resolve(SourceOptions(), env_for(tmp_path)).description == description


def test_a_nodes_file_in_the_config_is_relative_to_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'nodes_file = "lab-nodes"\n')
    (path.parent / "lab-nodes").write_text("node1\nnode2\nnode3\n")
    assert resolve(SourceOptions(), env_for(tmp_path)).description == "nodes (3)"


def test_no_source_anywhere_says_how_to_set_one(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError) as raised:
        resolve(SourceOptions(), env_for(tmp_path))
    message = str(raised.value)
    for way in ("--prometheus", "--node", "GPUWATCH_PROMETHEUS", "fleet.toml"):
        assert way in message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("prometheus = \n", "not valid TOML"),
        ('promethus = "http://p:9090"\n', "unknown key 'promethus'"),
        ("nodes = 3\n", "nodes: expected a list"),
        ('prometheus = "http://p:9090"\ntimeout = "soon"\n', "timeout"),
        ('prometheus = "http://p:9090"\nnodes = ["n1"]\n', "not both"),
    ],
    ids=["bad-toml", "unknown-key", "nodes-not-list", "bad-timeout", "both"],
)
def test_a_bad_config_file_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(InvalidValueError, match=says) as raised:
        resolve(SourceOptions(), env_for(tmp_path))
    assert "\n" not in str(raised.value)
    if says != "not both":
        assert str(path) in str(raised.value)


def test_a_token_file_becomes_a_bearer_header(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    options = http_options(SourceOptions(token_file=str(token)), {})
    assert options.authorization == "Bearer s3cret-token"
    assert "s3cret" not in repr(options)


def test_a_token_file_past_its_cap_is_refused_not_cut(tmp_path: Path) -> None:
    # GIVEN a token file of a first line, and more than 64 KiB after it
    token = tmp_path / "token"
    token.write_text("s3cret-token\n" + "x" * (64 << 10))
    # WHEN it is read THEN it is refused, naming the cap, never taken in part
    with pytest.raises(InvalidValueError) as refused:
        http_options(SourceOptions(token_file=str(token)), {})
    assert str(refused.value) == f"token file {token}: larger than 64KiB"


def test_basic_auth_takes_its_password_from_the_environment() -> None:
    options = http_options(SourceOptions(username="alice"), {"GPUWATCH_FLEET_PASSWORD": "pw"})
    assert options.authorization == "Basic " + base64.b64encode(b"alice:pw").decode()


@pytest.mark.parametrize(
    ("options", "env", "says"),
    [
        (SourceOptions(username="alice"), {}, "no password"),
        (
            SourceOptions(username="a"),
            {"GPUWATCH_FLEET_TOKEN": "t", "GPUWATCH_FLEET_PASSWORD": "p"},
            "not both",
        ),
        (SourceOptions(token_file="/nonexistent/token"), {}, "token file"),
        (SourceOptions(ca_file="/nonexistent/ca.pem"), {}, "cannot read"),
        (SourceOptions(username="alice"), {"GPUWATCH_FLEET_PASSWORD": "p\r\nX-Evil: 1"}, "control"),
    ],
    ids=["no-password", "token-and-user", "missing-token-file", "missing-ca", "header-injection"],
)
def test_bad_credentials_are_one_line(
    options: SourceOptions, env: dict[str, str], says: str
) -> None:
    with pytest.raises(InvalidValueError, match=says):
        http_options(options, env)


def test_the_prometheus_source_gets_the_timeout_and_tls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not used until a request\n")
    write_config(tmp_path, f'prometheus = "https://prom:9090"\nca_file = "{ca}"\ntimeout = "4s"\n')
    source = resolve(SourceOptions(), env_for(tmp_path))
    assert isinstance(source, PrometheusSource)
    assert source.client.timeout_s == 4.0 and source.client.options.ca_file == str(ca)


@pytest.mark.parametrize(
    ("options", "warned"),
    [
        (SourceOptions(nodes=("node1", "node2:9400", "https://node3:8443")), "node1:19400"),
        (SourceOptions(prometheus="http://prom:9090"), "http://prom:9090"),
        (SourceOptions(prometheus="https://prom:9090"), None),
    ],
    ids=["http-nodes", "http-prometheus", "https"],
)
def test_credentials_over_plain_http_are_warned_of_once(
    tmp_path: Path, options: SourceOptions, warned: str | None
) -> None:
    # GIVEN a bearer token, and servers reached over http or https
    env = env_for(tmp_path, GPUWATCH_FLEET_TOKEN="s3cret")
    said: list[str] = []
    # WHEN the source is resolved
    resolve(options, env, warn=said.append)
    # THEN where the token would go over plain http, that is said once, naming where
    if warned is None:
        assert said == []
    else:
        (message,) = said
        assert "clear text over http://" in message and warned in message
        assert "s3cret" not in message


def test_without_credentials_plain_http_is_no_warning(tmp_path: Path) -> None:
    said: list[str] = []
    resolve(SourceOptions(nodes=("node1",)), env_for(tmp_path), warn=said.append)
    assert said == []
