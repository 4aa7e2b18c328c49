"""Out-of-range values on the command line: a usage error (exit 2) naming the value, at once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.models import Snapshot
from tests.helpers.cli import run_cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "--sim", "2", "--watch", "9999999999"], "'--watch': '9999999999' is too long"),
        (
            ["status", "--sim", "2", "--watch", "25h"],
            "'--watch': '25h' is too long: the most is 1d",
        ),
        (["status", "--sim", "2", "--watch", "1", "--count", "٣"], "'--count': '٣' is not a"),
        (["status", "--sim", "2", "--watch", "1", "--count", "9" * 400], "'--count': '999"),
        (["status", "--sim", "٣"], "--sim ٣: a simulated node has 1 to 64 GPUs"),
        (["pick", "--sim", "2", "-n", "٣"], "'-n' / '--gpus': '٣' is not a whole number"),
        (["pick", "--sim", "2", "-n", "9" * 5000], "'-n' / '--gpus': '999"),
        (["pick", "--sim", "2", "--min-free", "9" * 400 + "G"], "'--min-free': '999"),
        (["pick", "--sim", "2", "--mem", "2000TiB"], "'--mem': '2000TiB' is too large"),
        (["pick", "--sim", "2", "--max-util", "nan"], "'--max-util': 'nan' is not a number"),
        (
            ["pick", "--sim", "2", "--max-util", "\u0661\u0660"],  # Arabic-Indic ten
            "'--max-util': '\u0661\u0660' is not a number",
        ),
        (["pick", "--sim", "2", "--timeout", "9" * 400], "'--timeout': '999"),
        (["pick", "--sim", "2", "--", ""], "COMMAND is empty: give the program to run after --"),
        (["pick", "--sim", "2", "--", "sh", "a\0b"], "COMMAND holds a NUL character"),
        (["pick", "--sim", "2", "--exclude", ""], "'--exclude': '' has an empty entry"),
        (["pick", "--sim", "2", "--exclude", "0,"], "'--exclude': '0,' has an empty entry"),
        (["pick", "--sim", "2", "--min-free", "10"], "'--min-free': '10' has no unit"),
        (["pick", "--sim", "2", "--mem", "10"], "'--mem': '10' has no unit"),
        (["pick", "--sim", "2", "--max-used", "1"], "'--max-used': '1' has no unit"),
        (["pick", "--sim", "2", "--max-used", "lots"], "'--max-used': 'lots' is not a size"),
        (["pick", "--sim", "2", "--allow-busy=yes"], "'--allow-busy' does not take a value"),
        (["pick", "--sim", "2", "-n", "-1"], "'-n' / '--gpus': '-1': ask for at least 1 GPU"),
        (
            ["daemon", "--sim", "2", "--interval", "9999999999"],
            "'--interval': '9999999999' is too long: the most is 1h",
        ),
        (["daemon", "--sim", "2", "--listen", "٩٤٠٠"], "give PORT or HOST:PORT"),
        (["status", "--host", ""], "'--host': '' is not a host name"),
        (["status", "--host", "-oProxyCommand=x"], "'--host': '-oProxyCommand=x' is not a"),
        (["tui", "--sim", "2", "--host", ""], "'--host': '' is not a host name"),
        (["tui", "--host", "-oProxyCommand=x"], "'--host': '-oProxyCommand=x' is not a"),
        (["status", "--sim", ""], "--sim '': give a GPU count"),
        (["pick", "--sim", ""], "--sim '': give a GPU count"),
        (["tui", "--sim", " "], "--sim ' ': give a GPU count"),
        (["status", "--backend", "nvml", "--sim", ""], "--sim '': give a GPU count"),
        (["daemon", "--sim", ""], "--sim '': give a GPU count"),
    ],
    ids=[
        "watch-ten-digits",
        "watch-over-a-day",
        "count-arabic-indic",
        "count-400-digits",
        "sim-arabic-indic",
        "gpus-arabic-indic",
        "gpus-5000-digits",
        "min-free-400-digits",
        "mem-too-large",
        "max-util-nan",
        "max-util-arabic-indic",
        "timeout-400-digits",
        "pick-empty-command",
        "pick-nul-in-command",
        "pick-exclude-empty",
        "pick-exclude-trailing-comma",
        "pick-min-free-without-unit",
        "pick-mem-without-unit",
        "pick-max-used-without-unit",
        "pick-max-used-not-a-size",
        "pick-allow-busy-with-a-value",
        "pick-negative-count",
        "daemon-interval-ten-digits",
        "daemon-listen-arabic-indic",
        "host-empty",
        "host-an-ssh-option",
        "tui-host-empty",
        "tui-host-an-ssh-option",
        "status-sim-empty",
        "pick-sim-empty",
        "tui-sim-blank",
        "nvml-sim-empty",
        "daemon-sim-empty",
    ],
)
def test_an_out_of_range_value_is_a_usage_error_naming_it(
    tmp_path: Path, args: list[str], message: str
) -> None:
    # GIVEN a value outside its range WHEN the command runs
    if args[0] == "daemon":
        args = [*args, "--socket", str(tmp_path / "s.sock")]
    result = run_cli(*args)
    # THEN one line names it, exit 2, and nothing else happened
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert result.stderr.startswith("gpuwatch: error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (("a = " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested too deeply"),
        (b'interval = "9999999999"\n', "interval '9999999999' is too long: the most is 1h"),
    ],
    ids=["binary", "deeply-nested", "interval-too-long"],
)
def test_a_bad_daemon_config_file_is_a_usage_error(
    tmp_path: Path, content: bytes, message: str
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_bytes(content)
    result = run_cli(
        "daemon", "--sim", "2", "--socket", str(tmp_path / "s.sock"), "--config", str(config)
    )
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert str(config) in result.stderr and message in result.stderr
    assert "unexpected" not in result.stderr and result.stderr.count("\n") == 1


def test_json_is_strict_even_when_a_value_is_not_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN a backend whose sample carries NaN and infinity (a driver's or a remote host's)
    real_sample = SimBackend.sample

    def broken(self: SimBackend, *args: object) -> Snapshot:
        snapshot = real_sample(self, *args)  # type: ignore[arg-type]
        gpus = (replace(snapshot.gpus[0], power_w=math.nan, power_limit_w=math.inf),)
        return replace(snapshot, gpus=gpus + snapshot.gpus[1:])

    monkeypatch.setattr(SimBackend, "sample", broken)
    # WHEN status prints JSON
    result = run_cli("status", "--sim", "2", "--json")
    # THEN it is strict JSON, the values that are no numbers as null
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert data["gpus"][0]["power_w"] is None and data["gpus"][0]["power_limit_w"] is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "GPUWATCH_SIM=abc: neither a GPU count (1-64) nor a scenario file"),
        ("0", "GPUWATCH_SIM=0: a simulated node has 1 to 64 GPUs"),
    ],
    ids=["not-a-count", "zero"],
)
@pytest.mark.parametrize("command", ["status", "pick"])
def test_a_bad_gpuwatch_sim_is_a_usage_error_naming_the_variable(
    command: str, value: str, message: str
) -> None:
    # GIVEN GPUWATCH_SIM set to what is neither a GPU count nor a file WHEN a command runs
    result = run_cli(command, env={"GPUWATCH_SIM": value})
    # THEN one line names the variable (not --sim, which was not given), exit 2
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert "--sim" not in result.stderr
