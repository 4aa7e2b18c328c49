"""A request no GPU of the node could ever meet ends at once, `--wait` or not, in `gpuwatch
pick` (through the installed command) and in `select(wait=True)` alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuwatch
from gpuwatch.errors import InvalidValueError
from gpuwatch.placement import selection as selection_module
from tests.helpers.mig import NODE

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
# Generous: a request that waits would wait for ever, so the limit only turns a hang into a
# failure; what is asserted is the exit status.
HANG_S = 60

IMPOSSIBLE = [
    pytest.param(
        ["--sim", "4", "--min-free", "100GiB"],
        "no GPU to choose from has 100.0GiB of memory in all (the largest: 79.6GiB)",
        id="memory-above-every-gpus-total",
    ),
    pytest.param(
        ["--sim", "4", "-n", "5"], "5 GPUs asked for, but this machine has 4", id="more-gpus"
    ),
    pytest.param(
        ["--sim", "{mig}", "--mig", "7g.80gb"],
        "--mig 7g.80gb: no MIG device of that profile to choose from",
        id="mig-profile-it-lacks",
    ),
]


@pytest.fixture
def mig_node(tmp_path: Path) -> str:
    path = tmp_path / "mig.toml"
    path.write_text(NODE)
    return str(path)


def pick(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUWATCH, "pick", *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("CUDA_")},
    )


@pytest.mark.timeout(2 * HANG_S)
@pytest.mark.parametrize("wait", [[], ["--wait"], ["--timeout", "1h"]], ids=["", "wait", "timeout"])
@pytest.mark.parametrize(("args", "reason"), IMPOSSIBLE)
def test_what_no_gpu_could_ever_give_ends_at_once_with_the_reason(
    args: list[str], reason: str, wait: list[str], mig_node: str
) -> None:
    # GIVEN a request this node could never meet, even with every GPU idle
    argv = [arg.format(mig=mig_node) for arg in args]
    # WHEN pick is asked for it, told to wait or not
    result = pick(*argv, *wait, "--", "true")
    # THEN it ends with the reason in one line and exit 2, as for any request it cannot take
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpuwatch: error: ")
    assert reason in result.stderr.splitlines()[0]
    assert "waiting" not in result.stderr


@pytest.mark.timeout(2 * HANG_S)
def test_what_a_busy_gpu_could_give_once_free_is_still_waited_for() -> None:
    # GIVEN two GPUs with 79GiB free asked for on a node of 79.6GiB GPUs, of which only one
    # is idle: possible, once the others' jobs end
    # WHEN pick waits for them, for a second
    result = pick("--sim", "4", "-n", "2", "--min-free", "79GiB", "--timeout", "1s", "--", "true")
    # THEN it waited, and gave up at its timeout
    assert result.returncode == 5, result.stderr
    assert "gave up after waiting" in result.stderr


@pytest.mark.timeout(2 * HANG_S)
def test_mig_on_a_node_without_mig_keeps_its_exit_4_when_waiting() -> None:
    result = pick("--sim", "2", "--mig", "any", "--wait", "--", "true")
    assert result.returncode == 4, result.stderr
    assert "--mig any: no GPU on this machine has MIG devices" in result.stderr


@pytest.mark.timeout(2 * HANG_S)
def test_a_whole_gpu_where_the_only_one_left_is_in_mig_mode_ends_at_once_pointing_to_mig(
    mig_node: str,
) -> None:
    # GIVEN a node whose GPU 0 is in MIG mode (one MIG device idle), and GPU 1 excluded
    # WHEN a whole GPU is waited for
    result = pick("--sim", mig_node, "--exclude", "1", "--wait", "--", "true")
    # THEN it is told at once, as when not waiting: GPU 0 is not given whole; use --mig
    assert result.returncode == 4, result.stderr
    assert "  GPU 0: MIG enabled" in result.stderr
    assert "1 MIG device is free: use --mig PROFILE|any" in result.stderr


SELECT_IMPOSSIBLE = [
    pytest.param({"sim": 4, "min_free": "100GiB"}, "has 100.0GiB of memory in all", id="memory"),
    pytest.param({"sim": 4, "n": 5}, "5 GPUs asked for, but this machine has 4", id="more-gpus"),
    pytest.param(
        {"sim": "{mig}", "mig": "7g.80gb"}, "mig='7g.80gb': no MIG device of that profile", id="mig"
    ),
]


@pytest.mark.timeout(2 * HANG_S)
@pytest.mark.parametrize(("arguments", "reason"), SELECT_IMPOSSIBLE)
def test_select_waiting_for_what_no_gpu_could_ever_give_raises_at_once(
    arguments: dict[str, object], reason: str, mig_node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a script that asks select() to wait for what this node could never give
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    given = {k: v.format(mig=mig_node) if isinstance(v, str) else v for k, v in arguments.items()}
    # WHEN it selects THEN it is told why at once, as a bad value, and holds nothing
    try:
        with pytest.raises(InvalidValueError, match=reason.replace("(", r"\(")):
            gpuwatch.select(wait=True, **given)  # type: ignore[arg-type]
    finally:
        if selection_module._this_process.selection is not None:
            selection_module._this_process.selection.release()
    assert selection_module._this_process.selection is None
