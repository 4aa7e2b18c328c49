"""`gpuwatch pick` reads its options as click reads the other commands' options."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.cli.argv import Option, parse
from gpuwatch.cli.pick import OPTIONS
from gpuwatch.errors import InvalidValueError
from tests.helpers.cli import run_cli


def read(*args: str) -> tuple[dict[str, Any], list[str]]:
    return parse(OPTIONS, args, command="gpuwatch pick")


@pytest.mark.parametrize(
    "args",
    [
        ["-n", "2"],
        ["-n2"],
        ["--gpus", "2"],
        ["--gpus=2"],
        ["-vn", "2"],
        ["-vn2"],
    ],
    ids=["short", "short-attached", "long", "long-equals", "flags-together", "all-together"],
)
def test_a_value_is_read_in_every_form_click_takes(args: list[str]) -> None:
    # WHEN the GPU count is given in one of click's forms
    values, command = read(*args, "python", "train.py")
    # THEN it is read, and what follows is the command
    assert values["gpus"] == 2 and command == ["python", "train.py"]


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["--", "-n", "3"], ["-n", "3"]),
        (["python", "-n", "3"], ["python", "-n", "3"]),
        (["--wait", "--", "--", "x"], ["--", "x"]),
        (["-"], ["-"]),
        ([], []),
    ],
    ids=["after-dashes", "after-first-word", "dashes-once", "lone-dash", "none"],
)
def test_the_commands_own_options_are_its_own(args: list[str], command: list[str]) -> None:
    values, rest = read(*args)
    assert rest == command and values["gpus"] == 1


def test_unset_options_have_their_defaults() -> None:
    values, _ = read()
    assert values["gpus"] == 1 and values["strategy"] == "most-free"
    assert values["exclude"] == [] and values["wait"] is False and values["mem"] is None


def test_a_repeated_option_collects_its_values() -> None:
    values, _ = read("--exclude", "0", "--exclude=1,2")
    assert values["exclude"] == ["0", "1,2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min"], "No such option '--min'"),
        (["-vq"], "No such option '-q'"),
        (["--timeout"], "Option '--timeout' requires an argument"),
        (["-n"], "Option '-n' / '--gpus' requires an argument"),
        (["--wait=yes"], "Option '--wait' does not take a value"),
        (
            ["--format", "name"],
            "Invalid value for '--format': 'name' is not one of 'uuid', 'index'",
        ),
        (["-n", "x"], "Invalid value for '-n' / '--gpus': 'x' is not a whole number"),
        (
            ["--mem=0GiB"],
            "Invalid value for '--mem': '0GiB' declares no memory: give what the job will use",
        ),
    ],
    ids=[
        "abbreviated",
        "unknown-short",
        "missing-value",
        "missing-short-value",
        "flag-with-value",
        "not-a-choice",
        "bad-value",
        "refused-value",
    ],
)
def test_bad_options_are_refused_in_clicks_words(args: list[str], message: str) -> None:
    with pytest.raises(InvalidValueError) as refused:
        read(*args)
    assert str(refused.value) == f"{message} (see 'gpuwatch pick --help')"


def test_help_stops_the_reading() -> None:
    # WHEN --help comes before something wrong THEN help is asked for, and nothing else
    values, command = read("--help", "--bogus", "-n", "x")
    assert values["help"] is True and command == []


def test_a_value_may_start_with_a_dash() -> None:
    options = [Option("--sim", metavar="N|FILE")]
    values, _ = parse(options, ["--sim", "-weird.toml"], command="x")
    assert values["sim"] == "-weird.toml"


def test_help_lists_every_option_once() -> None:
    # WHEN pick's help is read THEN each option is on a line of its own, with its value's name
    out = run_cli("pick", "--help", env={"COLUMNS": "200"}).stdout
    for option in OPTIONS:
        term = option.help_row()[0]
        assert sum(line.startswith(f"  {term}") for line in out.splitlines()) == 1, term
