"""The status table: lines that fit the terminal, and text from other users that cannot lie."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from gpuwatch.backends.sim import SimBackend
from gpuwatch.cli.table import Style, render
from gpuwatch.models import Snapshot
from tests.helpers.cli import FROZEN_TIME


def snapshot(gpus: int = 4) -> Snapshot:
    return SimBackend(gpus, clock=lambda: FROZEN_TIME).sample()


@pytest.mark.parametrize("width", [40, 60, 80, 120], ids=lambda width: f"{width}-columns")
@pytest.mark.parametrize("unicode", [True, False], ids=["unicode", "ascii"])
def test_no_line_is_wider_than_the_terminal(width: int, unicode: bool) -> None:
    # WHEN the table is drawn for a terminal WIDTH columns wide
    lines = render(snapshot(), style=Style(unicode=unicode), width=width).splitlines()
    # THEN every line fits, and every GPU keeps its index and its memory
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    gpu_lines = [line for line in lines if line.startswith("[")]
    assert len(gpu_lines) == 4 and all("/  79.6 GiB" in line for line in gpu_lines)


@pytest.mark.parametrize(
    ("width", "shown", "left_out"),
    [
        (120, ["█", "°C", " W"], []),
        (80, ["°C", " W"], ["█"]),
        (60, ["°C", "NVIDIA H100 80GB HBM3"], ["█", " W"]),
        (40, ["%", "H100"], ["█", " W", "°C", "NVIDIA"]),
    ],
    ids=["120-columns", "80-columns", "60-columns", "40-columns"],
)
def test_narrower_terminals_lose_bar_then_power_then_temperature_then_name(
    width: int, shown: list[str], left_out: list[str]
) -> None:
    line = render(snapshot(), width=width).splitlines()[1]
    assert all(text in line for text in shown), line
    assert not any(text in line for text in left_out), line


def test_columns_line_up_across_gpus() -> None:
    lines = [line for line in render(snapshot(), width=60).splitlines() if line.startswith("[")]
    assert len({tuple(i for i, c in enumerate(line) if c == "|") for line in lines}) == 1


@pytest.mark.parametrize(
    "evil",
    [
        "\x1b]0;owned\x07",  # an escape sequence that retitles the terminal
        "\u202e",  # right-to-left override: what follows reads backwards
        "\u2066",  # left-to-right isolate
        "\u200b",  # zero-width space
        "\u2028",  # line separator
        "\x9b31m",  # C1 control sequence introducer
    ],
    ids=["escape", "rtl-override", "isolate", "zero-width-space", "line-separator", "c1-csi"],
)
def test_control_and_format_characters_from_other_users_are_shown_as_question_marks(
    evil: str,
) -> None:
    # GIVEN a process, host and GPU whose names carry characters a terminal would act on
    base = snapshot(1)
    process = replace(base.processes[0], command=f"python {evil}txt.exe", user=f"eve{evil}")
    gpus = (replace(base.gpus[0], name=f"GPU{evil}"),)
    shot = replace(base, hostname=f"node{evil}", gpus=gpus, processes=(process,))
    # WHEN drawn THEN none of them reaches the terminal, and each is marked where it was
    table = render(shot, width=200)
    assert evil not in table and "\x1b" not in table and "\x9b" not in table
    assert "python ?" in table and "eve?" in table and "GPU?" in table and "node?" in table


@pytest.mark.parametrize("width", [40, 60, 120], ids=lambda width: f"{width}-columns")
def test_mig_devices_fit_the_terminal_too(width: int) -> None:
    # GIVEN a node with a MIG-enabled GPU WHEN drawn narrow or wide
    mig_node = Path(__file__).resolve().parents[2] / "examples" / "mig-node.toml"
    shot = SimBackend(mig_node, clock=lambda: FROZEN_TIME).sample()
    lines = render(shot, width=width).splitlines()
    # THEN every line fits, and every MIG device keeps its label and memory
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert sum(" GiB" in line and ":" in line.split("|")[0] for line in lines) == 3


@pytest.mark.parametrize("width", [40, 60, 80, 120], ids=lambda width: f"{width}-columns")
def test_the_column_names_stand_over_their_columns_within_the_width(width: int) -> None:
    # WHEN the table is drawn with its column names
    lines = render(snapshot(), width=width, column_names=True).splitlines()
    names, gpu = lines[1], lines[2]
    # THEN they come between the host line and the first GPU, no wider than the GPU's line
    assert names.startswith("GPU name") and gpu.startswith("[0] ")
    assert len(names) <= len(gpu) <= width
    # AND memory starts where its column does, and utilization ends where its figure does
    assert names.index("memory") == gpu.index("|") + 2
    assert names.index("util") + len("util") == gpu.index("%") + 1


def test_without_column_names_the_table_is_as_it_was() -> None:
    named = render(snapshot(), width=80, column_names=True).splitlines()
    assert render(snapshot(), width=80).splitlines() == [named[0], *named[2:]]
