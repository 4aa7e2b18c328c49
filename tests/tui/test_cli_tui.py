"""`gpuwatch tui` as users start it: bad options, no driver, and the real program in tmux."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.cli import run_cli
from tests.helpers.tmux import GPUWATCH, Tmux
from tests.helpers.wait import wait_until


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--interval", "soon"], "'soon' is not a duration"),
        (["--interval", "10ms"], "too short"),
        (["--backend", "cuda"], "'cuda' is not one of"),
        (["--sim", "zero"], "zero"),
        (["--sim", "4", "--backend", "nvml"], "cannot go with --backend nvml"),
        (["--idle-after", "-1"], "not a duration"),
        (["--colour"], "No such option"),
    ],
    ids=[
        "interval-word",
        "interval-too-short",
        "backend",
        "sim",
        "sim-with-nvml",
        "idle-after",
        "unknown",
    ],
)
def test_bad_values_are_one_line_usage_errors(args: list[str], complaint: str) -> None:
    result = run_cli("tui", *args)
    assert result.exit_code == ExitCode.USAGE, result.stderr
    assert result.stderr.startswith("gpuwatch: error:") and complaint in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_driver_it_says_so_before_the_screen_opens() -> None:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has the NVIDIA library")
    except OSError:
        pass
    result = run_cli("tui", "--backend", "nvml")
    assert result.exit_code == ExitCode.NO_GPU
    assert result.stderr.startswith("gpuwatch: error: NVIDIA driver not found")
    assert "\x1b[" not in result.stdout + result.stderr, "no screen was drawn"


def test_help_lists_the_options_of_status() -> None:
    result = run_cli("tui", "--help")
    for option in ("--interval", "--backend", "--sim", "--host", "--readonly", "--idle-after"):
        assert option in result.stdout


needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("GPUWATCH_REQUIRE_TMUX"),
    reason="needs tmux (apt-get install tmux)",
)


def installed_tui(lease_dir: Path, gpus: int, size: tuple[int, int]) -> Tmux:
    """The installed `gpuwatch tui --sim GPUS` in a real terminal of `size`."""
    command = shlex.join([GPUWATCH, "tui", "--sim", str(gpus)])
    return Tmux(f"GPUWATCH_LEASE_DIR={shlex.quote(str(lease_dir))} {command}", size)


@pytest.mark.slow
@needs_tmux
def test_the_installed_command_in_a_real_terminal(lease_dir: Path) -> None:
    # GIVEN the installed `gpuwatch tui --sim 4` in a 100x30 terminal
    terminal = installed_tui(lease_dir, 4, (100, 30))
    try:
        # WHEN the first frame is drawn THEN it shows the GPUs and their processes
        screen = terminal.wait_for("python train.py")
        assert "[0] NVIDIA H100 80GB HBM3" in screen and "sim-node" in screen
        # AND ? opens the help, which Esc... or q closes; a second q quits cleanly
        terminal.press("?")
        terminal.wait_for("Show this help")
        terminal.press("q")
        wait_until(
            lambda: "Show this help" not in terminal.text(),
            "the help to close",
            timeout_s=30,
            interval_s=0.2,
        )
        terminal.press("q")
        screen = terminal.wait_for("EXIT=")
        assert "EXIT=0" in screen
        assert "Traceback" not in screen
    finally:
        terminal.close()


def sort_shown(screen: str) -> str:
    """The status line's order (`CPU% ▲`), or "" where it shows none."""
    return screen.partition("sorted by ")[2].partition("  ")[0].strip()


@pytest.mark.slow
@needs_tmux
def test_the_sort_chosen_is_back_when_the_terminal_widens_again(lease_dir: Path) -> None:
    # GIVEN the installed `gpuwatch tui --sim 8` in a wide terminal, sorted by CPU% lowest first
    terminal = installed_tui(lease_dir, 8, (140, 30))
    try:
        order = sort_shown(terminal.wait_for("sorted by GPU-MEM ▼"))
        while not order.startswith("CPU%"):
            terminal.press("s")
            order = wait_until(
                lambda before=order: (now := sort_shown(terminal.text())) != before and now,
                "the next sort column",
            )
        terminal.press("r")
        terminal.wait_for("sorted by CPU% ▲")
        # WHEN it narrows to 80x24, THEN the order shown is GPU-MEM's, CPU% being dropped
        terminal.resize((80, 24))
        screen = terminal.wait_for("sorted by GPU-MEM ▼")
        assert "CPU%" not in screen.split("sorted by")[0]
        # AND when it widens again, CPU% sorts it again, lowest first
        terminal.resize((140, 30))
        terminal.wait_for("sorted by CPU% ▲")
        terminal.press("q")
        assert "EXIT=0" in terminal.wait_for("EXIT=")
    finally:
        terminal.close()


def test_readme_key_table_lists_every_key() -> None:
    from gpuwatch.tui.node.keys import KEYS

    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "status.md").read_text()
    section = readme.split("## `gpuwatch tui`", 1)[1].split("\n## ", 1)[0]
    keys_table = section.split("| key | does |", 1)[1].split("\n\n", 1)[0]
    for key in KEYS:
        for shown in key.shown.split():
            assert f"`{shown}`" in keys_table, f"README's key table lacks {shown}"
