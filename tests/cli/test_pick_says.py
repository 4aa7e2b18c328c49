"""What the installed `gpuwatch pick` says on stderr, as a user sees it: which GPUs it chose,
and what it waits for; stdout stays the command's, or the choice's alone."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tmux import GPUWATCH, Tmux

UUID = {gpu.index: gpu.uuid for gpu in SimBackend(4, clock=lambda: FROZEN_TIME).sample().gpus}


def shell(script: str) -> subprocess.CompletedProcess[str]:
    """`script` in sh, with `gpuwatch` the installed command and no CUDA variables set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env["PATH"] = f"{Path(GPUWATCH).parent}:{env['PATH']}"
    return subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=60, check=False, env=env
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--sim", "4"], "gpuwatch: chose GPU 3\n"),
        (["--sim", "4", "-n", "2", "--allow-busy"], "gpuwatch: chose GPUs 3, 2\n"),
    ],
    ids=["one", "two"],
)
def test_a_job_is_told_in_one_line_which_gpus_it_runs_on_by_index(
    args: list[str], said: str
) -> None:
    # WHEN a command runs under pick
    command = ["gpuwatch", "pick", *args, "--", "printenv", "CUDA_VISIBLE_DEVICES"]
    result = shell(shlex.join(command))
    # THEN stderr says which GPUs, by nvidia-smi index, in one line; stdout is the command's
    assert result.returncode == 0, result.stderr
    assert result.stderr == said
    assert result.stdout.strip().startswith("GPU-")


def test_the_choice_captured_by_the_shell_is_the_choice_alone() -> None:
    # WHEN the choice is captured, as `export CUDA_VISIBLE_DEVICES=$(gpuwatch pick -n 2)`
    result = shell('visible=$(gpuwatch pick --sim 4 -n 2 --allow-busy) && echo "[$visible]"')
    # THEN the variable holds the UUIDs alone, and stderr names the GPUs by index
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"[{UUID[3]},{UUID[2]}]\n"
    assert result.stderr.startswith("gpuwatch: chose GPUs 3, 2\n")


# What vLLM did before its UUID support (issues 13815, 20939): each entry read as an integer.
READS_INTEGERS = (
    'python3 -c \'import os; print([int(e) for e in os.environ["CUDA_VISIBLE_DEVICES"]'
    '.split(",")], os.environ.get("CUDA_DEVICE_ORDER"))\''
)


def test_a_tool_that_reads_the_variable_as_integers_runs_under_format_index() -> None:
    # GIVEN a tool that reads CUDA_VISIBLE_DEVICES as integers
    # WHEN pick runs it as the guide says, and as by default
    indexed = shell(f"gpuwatch pick --sim 4 -n 2 --allow-busy --format index -- {READS_INTEGERS}")
    by_uuid = shell(f"gpuwatch pick --sim 4 -n 2 --allow-busy -- {READS_INTEGERS}")
    # THEN with --format index it gets the indices pick named, in the order nvidia-smi counts
    assert indexed.returncode == 0, indexed.stderr
    assert indexed.stdout == "[3, 2] PCI_BUS_ID\n"
    assert indexed.stderr == "gpuwatch: chose GPUs 3, 2\n"
    # AND by default, with UUIDs, it fails as such tools do
    assert by_uuid.returncode != 0 and "invalid literal for int()" in by_uuid.stderr


def test_verbose_adds_the_uuids() -> None:
    result = shell("gpuwatch pick -v --sim 4 -- true")
    assert result.returncode == 0, result.stderr
    assert f"gpuwatch: chose GPU 3 ({UUID[3]})\n" in result.stderr


def test_a_wait_says_what_it_waits_for_not_how_long_at_the_start() -> None:
    # GIVEN two GPUs with 79GiB free wanted where one qualifies, and stderr not a terminal
    # WHEN pick waits for them, for a moment
    result = shell("gpuwatch pick --sim 4 -n 2 --min-free 79GiB --timeout 0.3s -- true")
    # THEN its one note says what it waits for, with no "0s"
    assert result.returncode == 5, result.stderr
    assert result.stderr.startswith(
        "gpuwatch: waiting for 2 idle GPUs with 79.0GiB free, 1 qualifies now (Ctrl-C to give up)\n"
    )


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("GPUWATCH_REQUIRE_TMUX"),
    reason="needs tmux (apt-get install tmux)",
)
def test_in_a_terminal_the_time_waited_appears_once_it_is_worth_saying(lease_dir: Path) -> None:
    # GIVEN a pick waiting in an 80x24 terminal for what only busy GPUs could give
    command = shlex.join([GPUWATCH, "pick", "--sim", "4", "-n", "2", "--min-free", "79GiB"])
    terminal = Tmux(
        f"GPUWATCH_LEASE_DIR={shlex.quote(str(lease_dir))} {command} --wait -- true", (80, 24)
    )
    try:
        # WHEN it starts THEN it says what it waits for, and no time yet, within 80 columns
        screen = terminal.wait_for("GPU 3: qualifies (79.1GiB free)")
        assert screen.startswith(
            "gpuwatch: waiting for 2 idle GPUs with 79.0GiB free, 1 qualifies now\n"
            "(Ctrl-C to give up)\n"
        )
        # AND after ten seconds the time waited is said too, nothing cut at the edge
        screen = terminal.wait_for("s so far), 1 qualifies")
        assert re.match(
            r"gpuwatch: waiting for 2 idle GPUs with 79.0GiB free \(\d+s so far\), 1 qualifies\n"
            r"now \(Ctrl-C to give up\)\n  GPU 0: in use by alice",
            screen,
        ), screen
        # AND Ctrl-C gives up, as it says
        terminal.press("C-c")
        terminal.wait_for("EXIT=130")
    finally:
        terminal.close()
