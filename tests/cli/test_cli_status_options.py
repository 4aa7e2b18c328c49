"""`gpuwatch status`'s own refusals, worded as click words every usage error."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli


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
