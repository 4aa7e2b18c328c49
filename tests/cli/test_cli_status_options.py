"""`gpuwatch status` reads its options without click, and means by them what click does."""

from __future__ import annotations

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.cli.status import status_options
from gpuwatch.cli.status_command import status
from tests.helpers.cli import run_cli

# Words a command line is made of: every option, good and bad values, and mistakes.
WORDS = [
    *("--json", "--json=1", "-v", "--verbose", "-vh", "-h", "--help", "--", "-", "-x"),
    *("--watch", "1", "500ms", "0.01", "25h", "--watch=2", "--count", "3", "٣", "0"),
    *("--host", "", "-oProxyCommand=x", "alice@node7", "--color", "always", "bogus"),
    *("--color=never", "--sim", "2", "--backend", "sim", "--backend=daemon", "--frob"),
    "--no-jobs",
]


def clicks_reading(args: list[str]) -> dict[str, object] | None:
    """The arguments click gives the command, or None where it prints help or an error."""
    try:
        with status.make_context("status", list(args)) as ctx:
            params = dict(ctx.params)
    except (click.UsageError, click.exceptions.Exit):
        return None
    if params["count"] is not None and params["interval_s"] is None:
        return None  # the command refuses it, in click's words
    return params


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--json"],
        ["--watch", "500ms", "--count", "3", "--json"],
        ["--watch=2", "-v", "--color=always", "--no-jobs"],
        ["--host", "alice@node7", "--sim", "2", "--backend", "sim"],
        ["--"],
    ],
    ids=["nothing", "json", "watch-count", "equals", "host", "dashes"],
)
def test_a_well_formed_line_is_read_as_click_reads_it(args: list[str]) -> None:
    assert status_options(args) == clicks_reading(args) is not None


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=6))
def test_every_line_is_read_as_click_reads_it_or_left_to_click(args: list[str]) -> None:
    # WHEN any command line is read without click
    ours, clicks = status_options(args), clicks_reading(args)
    # THEN the values are click's, and whatever click refuses (or answers with help) is
    # left to click, so that help and every error are worded by click (it may be left a
    # line click takes, such as a bad value that a later one replaces: click runs it)
    assert ours is None or ours == clicks
    assert clicks is not None or ours is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--count", "2", "--sim", "2"], "--count needs --watch (see 'gpuwatch status --help')"),
        (["--watch", "0.01"], "Invalid value for '--watch': '0.01' is too short: the least is"),
        (["--color", "red"], "Invalid value for '--color': 'red' is not one of 'auto', 'alw"),
        (["--json", "extra"], "Got unexpected extra argument (extra) (see 'gpuwatch status"),
    ],
    ids=["count-alone", "watch-too-short", "bad-colour", "extra-argument"],
)
def test_mistakes_are_worded_by_click(args: list[str], message: str) -> None:
    result = run_cli("status", *args)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""
