"""Every command's help and messages look alike."""

from __future__ import annotations

import pytest

from gpuwatch.cli.group import COMMANDS, command
from tests.helpers.cli import run_cli

HELPED = [[], ["status"], ["pick"], ["daemon"], ["torch-report"]]


@pytest.mark.parametrize("columns", [60, 120], ids=["60-columns", "120-columns"])
@pytest.mark.parametrize(
    "command", HELPED, ids=["gpuwatch", "status", "pick", "daemon", "torch-report"]
)
def test_help_fits_the_terminal_and_has_one_shape(command: list[str], columns: int) -> None:
    # GIVEN a terminal COLUMNS wide WHEN a command's help is asked for
    result = run_cli(*command, "--help", env={"COLUMNS": str(columns)})
    # THEN it is printed on stdout in click's shape, and no line is wider than the terminal
    assert result.exit_code == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Usage: {' '.join(['gpuwatch', *command])} [OPTIONS]")
    assert "Options:" in lines
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    help_line = next(line for line in lines if line.lstrip().startswith("-h, --help"))
    assert help_line.split()[-4:] == ["Show", "this", "message", "and"] or help_line.endswith(
        "Show this message and exit."
    )


@pytest.mark.parametrize("columns", [60, 120], ids=["60-columns", "120-columns"])
def test_pick_and_status_lay_out_options_alike(columns: int) -> None:
    env = {"COLUMNS": str(columns)}
    status, pick = (run_cli(name, "--help", env=env).stdout for name in ("status", "pick"))
    # THEN options they share read the same, to the column
    for option in ("  -h, --help", "  --sim N|FILE", "  -v, --verbose"):
        status_line = next(line for line in status.splitlines() if line.startswith(option))
        pick_line = next(line for line in pick.splitlines() if line.startswith(option))
        text_column = len(status_line) - len(status_line[len(option) :].lstrip())
        assert text_column == len(pick_line) - len(pick_line[len(option) :].lstrip())
    assert "Examples:" in status and "Examples:" in pick


def test_help_uses_a_wide_terminal() -> None:
    result = run_cli("pick", "--help", env={"COLUMNS": "120"})
    assert max(len(line) for line in result.stdout.splitlines()) > 80


def test_bare_gpuwatch_prints_its_help_as_help() -> None:
    # WHEN gpuwatch is run with nothing
    result = run_cli()
    # THEN it prints the same help as --help, on stdout, and no error
    assert result.exit_code == 0 and result.stderr == ""
    assert result.stdout == run_cli("--help").stdout
    assert result.stdout.rstrip().splitlines()[-1].split()[0] == list(COMMANDS)[-1]


@pytest.mark.parametrize("command", ["status", "pick"])
def test_backend_help_says_auto_prefers_the_daemon(command: str) -> None:
    help_text = " ".join(run_cli(command, "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "auto (the daemon if it runs, else the NVIDIA driver)" in help_text


def test_a_simulated_node_is_not_told_to_try_a_simulated_node() -> None:
    # GIVEN --sim 4, and CUDA_VISIBLE_DEVICES leaving no GPU
    result = run_cli("pick", "--sim", "4", env={"CUDA_VISIBLE_DEVICES": ""})
    # THEN the error says why, without suggesting --sim 4
    assert result.exit_code == 3
    assert "hides every GPU" in result.stderr and "--sim" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "--frobnicate"], "No such option '--frobnicate'"),
        (["pick", "--frobnicate"], "No such option '--frobnicate'"),
        (["status", "--watch"], "Option '--watch' requires an argument"),
        (["pick", "--timeout"], "Option '--timeout' requires an argument"),
    ],
    ids=["status-unknown", "pick-unknown", "status-no-value", "pick-no-value"],
)
def test_usage_errors_are_worded_alike(args: list[str], message: str) -> None:
    # THEN one line says what is wrong (click may add which option was meant) and where
    # the options are explained
    result = run_cli(*args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert result.stderr.endswith(f" (see 'gpuwatch {args[0]} --help')\n")


@pytest.mark.parametrize("command", ["status", "pick", "daemon"])
def test_defaults_read_as_every_other_default(command: str) -> None:
    # WHEN a command's help is read on a wide terminal
    help_text = " ".join(run_cli(command, "--help", env={"COLUMNS": "200"}).stdout.split())
    # THEN each default reads "[default: VALUE]", never click's "[default: (VALUE)]"
    assert "[default: (" not in help_text
    if command == "daemon":
        assert "[default: 1s]" in help_text and "[default: 24h]" in help_text


@pytest.mark.parametrize("name", ["status", "daemon", "tui", "fleet", "job-report", "torch-report"])
def test_a_command_parsed_without_the_group_still_answers_dash_h(name: str) -> None:
    # GIVEN a command's arguments parsed by the command alone, not through `gpuwatch`
    # (as a test of a deployment's arguments does): click keeps the help option it made then
    found = command(name)
    with found.make_context(name, ["--help"], resilient_parsing=True):
        pass
    # WHEN `gpuwatch NAME -h` is run later in the same process
    result = run_cli(name, "-h")
    # THEN it prints the help, as it does in a fresh process
    assert result.exit_code == 0 and result.stdout.startswith(f"Usage: gpuwatch {name}")
