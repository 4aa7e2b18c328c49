"""Every command's help and usage errors, as click gives them through `gpuwatch.cli.main`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.cli.group import COMMANDS, command
from tests.helpers.cli import run_cli


def options_of(name: str) -> list[click.Option]:
    return [param for param in command(name).params if isinstance(param, click.Option)]


def taking_a_value(name: str) -> list[click.Option]:
    return [option for option in options_of(name) if not option.is_flag]


def one_error_line(stderr: str) -> str:
    assert stderr.startswith("gpuwatch: error: ") and stderr.count("\n") == 1, stderr
    return stderr


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_lists_every_option(name: str) -> None:
    # WHEN a command's help is asked for on a wide terminal
    result = run_cli(name, "--help", env={"COLUMNS": "200"})
    # THEN it is printed on stdout, exit 0, with the usage line and every option's names
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Usage: gpuwatch {name} [OPTIONS]")
    options = lines[lines.index("Options:") :]
    terms = [line.split("  ")[1] for line in options if line.startswith("  -")]
    for option in options_of(name):
        shown = [term for term in terms if term.split()[0].rstrip(",") in option.opts]
        assert len(shown) == 1, f"{name} --help shows {option.opts} {len(shown)} times"
        assert all(flag in shown[0] for flag in option.opts)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_an_unknown_option_is_one_line_naming_it(name: str) -> None:
    result = run_cli(name, "--frobnicate")
    assert result.exit_code == ExitCode.USAGE and result.stdout == ""
    assert "No such option '--frobnicate'" in one_error_line(result.stderr)
    assert f"(see 'gpuwatch {name} --help')" in result.stderr


MISSING_VALUE = [
    (name, flag) for name in COMMANDS for option in taking_a_value(name) for flag in option.opts
]


@pytest.mark.parametrize(
    ("name", "flag"), MISSING_VALUE, ids=[f"{name}{flag}" for name, flag in MISSING_VALUE]
)
def test_an_option_without_its_value_is_one_line_naming_it(name: str, flag: str) -> None:
    result = run_cli(name, flag)
    assert result.exit_code == ExitCode.USAGE and result.stdout == ""
    message = one_error_line(result.stderr)
    assert f"Option '{flag}' requires an argument (see 'gpuwatch {name} --help')" in message


# A bad value for every option whose value is checked, and what the one line says.
BAD_VALUES: dict[tuple[str, str], tuple[str, str]] = {
    ("status", "--backend"): ("cuda", "Invalid value for '--backend': 'cuda' is not one of"),
    ("status", "--sim"): ("abc", "--sim abc: neither a GPU count"),
    ("status", "--watch"): ("soon", "Invalid value for '--watch': 'soon' is not a duration"),
    ("status", "--count"): ("0", "Invalid value for '--count': '0'"),
    ("status", "--host"): ("", "Invalid value for '--host': '' is not a host name"),
    ("status", "--color"): ("red", "Invalid value for '--color': 'red' is not one of"),
    ("pick", "--gpus"): ("x", "Invalid value for '-n' / '--gpus': 'x' is not a whole number"),
    ("pick", "--min-free"): ("10", "Invalid value for '--min-free': '10' has no unit"),
    ("pick", "--max-util"): ("nan", "Invalid value for '--max-util': 'nan' is not a number"),
    ("pick", "--max-used"): ("lots", "Invalid value for '--max-used': 'lots' is not a size"),
    ("pick", "--mem"): ("0GiB", "Invalid value for '--mem': '0GiB' declares no memory"),
    ("pick", "--strategy"): ("best", "Invalid value for '--strategy': 'best' is not one of"),
    ("pick", "--mig"): ("2g", "Invalid value for '--mig': '2g': give a MIG profile"),
    ("pick", "--exclude"): ("0,", "Invalid value for '--exclude': '0,' has an empty entry"),
    ("pick", "--timeout"): ("soon", "Invalid value for '--timeout': 'soon' is not a duration"),
    ("pick", "--format"): ("name", "Invalid value for '--format': 'name' is not one of"),
    ("pick", "--backend"): ("cuda", "Invalid value for '--backend': 'cuda' is not one of"),
    ("pick", "--sim"): ("", "--sim '': give a GPU count"),
    ("where", "--gpus"): ("two", "Invalid value for '-n' / '--gpus': 'two'"),
    ("where", "--min-free"): ("40", "Invalid value for '--min-free': '40' has no unit"),
    ("where", "--max-util"): ("101", "Invalid value for '--max-util': '101'"),
    ("where", "--max-used"): ("1", "Invalid value for '--max-used': '1' has no unit"),
    ("where", "--mem"): ("0B", "Invalid value for '--mem': '0B' declares no memory"),
    ("where", "--strategy"): ("best", "Invalid value for '--strategy': 'best' is not one of"),
    ("where", "--mig"): ("2g", "Invalid value for '--mig': '2g': give a MIG profile"),
    ("where", "--limit"): ("0", "Invalid value for '--limit': '0'"),
    ("where", "--timeout"): ("soon", "Invalid value for '--timeout': 'soon' is not a duration"),
    ("where", "--sim"): ("0", "Invalid value for '--sim': '0'"),
    ("where", "--max-bytes"): ("64", "Invalid value for '--max-bytes': '64' has no unit"),
    ("tui", "--backend"): ("cuda", "Invalid value for '--backend': 'cuda' is not one of"),
    ("tui", "--sim"): (" ", "--sim ' ': give a GPU count"),
    ("tui", "--interval"): ("50ms", "Invalid value for '--interval': '50ms' is too short"),
    ("tui", "--host"): ("-oProxyCommand=x", "Invalid value for '--host': '-oProxyCommand=x'"),
    ("tui", "--idle-after"): ("8d", "Invalid value for '--idle-after': '8d' is too long"),
    ("fleet", "--interval"): ("0.1", "Invalid value for '--interval': '0.1' is too short"),
    ("fleet", "--idle-after"): ("8d", "Invalid value for '--idle-after': '8d' is too long"),
    ("fleet", "--timeout"): ("soon", "Invalid value for '--timeout': 'soon' is not a duration"),
    ("fleet", "--sim"): ("٣", "Invalid value for '--sim': '٣' is not a whole number"),
    ("fleet", "--max-bytes"): ("2KiB", "Invalid value for '--max-bytes': '2KiB' is out of range"),
    ("daemon", "--interval"): ("0", "Invalid value for '--interval': '0' is too short"),
    ("daemon", "--history"): ("1000d", "Invalid value for '--history': history 1000d at"),
    ("daemon", "--socket"): ("", "Invalid value for '--socket': give a path"),
    ("daemon", "--listen"): ("http", "Invalid value for '--listen': listen 'http': give PORT"),
    ("daemon", "--node-name"): ("a b", "Invalid value for '--node-name': node name 'a b'"),
    ("daemon", "--web-config"): ("", "Invalid value for '--web-config': give a path"),
    ("daemon", "--jobs"): ("pbs", "Invalid value for '--jobs': 'pbs' is not one of"),
    ("daemon", "--jobs-refresh"): ("0", "Invalid value for '--jobs-refresh': '0' is too short"),
    ("daemon", "--idle-window"): ("0", "Invalid value for '--idle-window': '0' is too short"),
    ("daemon", "--slurm-conf"): ("", "Invalid value for '--slurm-conf': give a path"),
    ("daemon", "--pod-resources-socket"): (
        "",
        "Invalid value for '--pod-resources-socket': give a path",
    ),
    ("daemon", "--config"): ("", "Invalid value for '--config': give a path"),
    ("daemon", "--backend"): ("cuda", "Invalid value for '--backend': 'cuda' is not one of"),
    ("daemon", "--sim"): ("", "--sim '': give a GPU count"),
}


@pytest.mark.parametrize(
    ("name", "flag"), list(BAD_VALUES), ids=[f"{name}{flag}" for name, flag in BAD_VALUES]
)
def test_a_bad_value_is_one_line_naming_the_option(tmp_path: Path, name: str, flag: str) -> None:
    # GIVEN a value the option refuses
    value, message = BAD_VALUES[name, flag]
    # (a daemon that would start gets a socket of its own; the bad value comes last)
    setup = ["--socket", str(tmp_path / "s.sock")] if name == "daemon" else []
    # WHEN the command runs with it
    result = run_cli(name, *setup, flag, value)
    # THEN one line says what is wrong with it, exit 2, and nothing else happened
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert message in one_error_line(result.stderr)
    assert result.stdout == ""


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_checked_option_has_a_bad_value_above(name: str) -> None:
    # An option whose value click converts (not free text) is listed in BAD_VALUES.
    checked = [option for option in taking_a_value(name) if option.type is not click.STRING]
    missing = [option.opts[-1] for option in checked if (name, option.opts[-1]) not in BAD_VALUES]
    assert missing == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--", "-n", "3"], ["-n", "3"]),
        (["python", "-n", "3"], ["python", "-n", "3"]),
        (["-v", "--", "ls", "-la"], ["ls", "-la"]),
        (["--wait", "--", "--", "x"], ["--", "x"]),
        (["-"], ["-"]),
        ([], []),
    ],
    ids=["after-dashes", "after-first-word", "own-options-first", "dashes-once", "dash", "none"],
)
def test_picks_options_end_where_the_command_starts(args: list[str], expected: list[str]) -> None:
    # WHEN pick's command line is read THEN what follows its own options is the command's
    params = command("pick").make_context("pick", list(args)).params
    assert list(params["command"]) == expected and params["gpus"] == 1


@pytest.mark.parametrize("separator", [["--"], []], ids=["after-dashes", "after-the-first-word"])
def test_the_command_gets_its_own_options(tmp_path: Path, separator: list[str]) -> None:
    # GIVEN a command whose options are pick's too
    words = ["sh", "-c", 'printf "%s\\n" "$*"', "sh", "-n", "3", "--gpus", "-v"]
    pick = [sys.executable, "-m", "gpuwatch", "pick", "--sim", "2", "--allow-busy"]
    # WHEN pick runs it (in a process of its own: pick becomes the command)
    done = subprocess.run(
        [*pick, *separator, *words],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GPUWATCH_LEASE_DIR": str(tmp_path)},
    )
    # THEN the command is given them, untouched
    assert done.returncode == 0, done.stderr
    assert done.stdout == "-n 3 --gpus -v\n"


@pytest.mark.parametrize(
    "args",
    [["-n", "2"], ["-n2"], ["--gpus", "2"], ["--gpus=2"], ["-vn", "2"], ["-vn2"]],
    ids=["short", "short-attached", "long", "long-equals", "flags-together", "all-together"],
)
def test_a_value_is_read_in_every_form_click_takes(args: list[str]) -> None:
    context = command("pick").make_context("pick", [*args, "python", "train.py"])
    assert context.params["gpus"] == 2 and context.params["command"] == ("python", "train.py")


def test_unset_options_have_their_defaults() -> None:
    params = command("pick").make_context("pick", []).params
    assert params["gpus"] == 1 and params["strategy"] == "most-free"
    assert params["exclude"] == () and params["wait"] is False and params["mem"] is None


def test_a_repeated_option_collects_its_values() -> None:
    params = command("pick").make_context("pick", ["--exclude", "0", "--exclude=1,2"]).params
    assert params["exclude"] == ("0", "1,2")


def test_a_value_may_start_with_a_dash() -> None:
    params = command("pick").make_context("pick", ["--sim", "-weird.toml"]).params
    assert params["sim"] == "-weird.toml"
