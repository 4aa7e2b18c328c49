"""Slurm's hostlists, expanded as Slurm's own `scontrol show hostnames` expands them."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.jobs.hostlist import (
    MAX_NAMES,
    HostlistError,
    HostlistTooLarge,
    expand_hostlist,
    in_hostlist,
)

DEADLINE_S = 30.0  # generous: the test machine's cores are shared

EXPRESSIONS = [
    pytest.param("vm", id="one"),
    pytest.param("node[01-03,07],gpu14", id="ranges-and-a-name"),
    pytest.param("/dev/nvidia[7,0-3]", id="device-files-out-of-order"),
    pytest.param("/dev/nvidia7,/dev/nvidia5", id="a-list"),
    pytest.param("x[001-3]", id="width-of-the-first"),
    pytest.param("r[1-2]n[8-9]", id="two-brackets"),
    pytest.param("a[1-2]b[3-4]c[5-6]", id="three-brackets-slurms-order"),
    pytest.param("compute-r3i[4-5]n[0-1],compute-ia[801-803]", id="multi-dimensional"),
    pytest.param("tux[0-2]  tux5", id="blanks-separate"),
    pytest.param("r[1-2]i[08-10]n[0,2]x[1-2]", id="four-brackets-widths"),
    pytest.param("n[0-1][2-3]", id="adjacent-brackets"),
]


def scontrol_hostnames(expression: str, tmp_path: Path) -> list[str]:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=h\nSlurmctldHost=localhost\nNodeName=localhost\n")
    done = subprocess.run(
        ["scontrol", "show", "hostnames", expression],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SLURM_CONF": str(conf)},
    )
    return done.stdout.split()


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_a_hostlist_expands_as_slurm_expands_it(expression: str, tmp_path: Path) -> None:
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (apt-get install slurm-client)")
    # GIVEN a hostlist WHEN gpuwatch and Slurm expand it THEN the names and their order agree
    assert expand_hostlist(expression) == scontrol_hostnames(expression, tmp_path)


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("n[1-3]-ib", id="text-after-the-last-bracket"),
        pytest.param("n[3-1]", id="upside-down"),
        pytest.param("n[1-", id="unclosed"),
        pytest.param("n[a-b]", id="not-numbers"),
        pytest.param("n[0-99999999]", id="too-long"),
        pytest.param("n[1-2", id="unclosed-range"),
    ],
)
def test_what_slurm_refuses_is_refused(expression: str) -> None:
    with pytest.raises(HostlistError):
        expand_hostlist(expression)


def test_a_node_is_found_in_a_hostlist_without_listing_every_name() -> None:
    # GIVEN a long hostlist WHEN a node is looked for THEN found, or not
    assert in_hostlist("gpu-dy-p3-3", "cpu-[1-10],gpu-dy-p3-[1-10]")
    assert not in_hostlist("gpu-dy-p3-30", "cpu-[1-10],gpu-dy-p3-[1-10]")
    assert not in_hostlist("n1", "n[1-3]-ib")  # no hostlist: it names no node


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        pytest.param("a[0-65535]b[0-65535]", "more than 65536 names", id="two-brackets-4-gi-names"),
        pytest.param("n[0-65536]", "more than 65536 names", id="one-past-the-cap"),
        pytest.param("n[0-9]," * 7000, "more than 65536 names", id="many-tokens"),
        pytest.param("x" * 300 + "[0-65535]", "characters", id="long-names"),
        pytest.param("n" + "[1]" * 1500, "more than 16 brackets", id="1500-brackets"),
        pytest.param("n[" + "1" * 5000 + "]", "more than 18 digits", id="5000-digit-number"),
        pytest.param("n[1-" + "9" * 5000 + "]", "more than 18 digits", id="5000-digit-range"),
    ],
)
def test_a_hostlist_beyond_the_limits_is_one_line_at_once(expression: str, why: str) -> None:
    # GIVEN an expression naming more than is believed, or written beyond the limits
    # WHEN it is expanded, or a name looked for in it, within a deadline
    outcomes: list[BaseException] = []

    def read() -> None:
        for call in (lambda: expand_hostlist(expression), lambda: in_hostlist("vm", expression)):
            try:
                call()
            except HostlistTooLarge as error:
                outcomes.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(DEADLINE_S)
    # THEN both end with one line saying why (never Python's own exception)
    assert not reader.is_alive(), "still expanding"
    assert len(outcomes) == 2
    for error in outcomes:
        assert why in str(error) and "\n" not in str(error) and len(str(error)) < 200


def test_a_hostlist_at_the_cap_is_read_whole() -> None:
    names = expand_hostlist("n[0-65535]")
    assert (len(names), names[0], names[-1]) == (MAX_NAMES, "n0", "n65535")
    assert in_hostlist("n65535", "n[0-65535]") and not in_hostlist("n65536", "n[0-65535]")


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("[[[1]]]", id="nested"),
        pytest.param("n[1]]", id="stray-closing"),
        pytest.param("n[]", id="empty"),
    ],
)
def test_brackets_slurm_cannot_read_name_no_node(expression: str) -> None:
    with pytest.raises(HostlistError, match=r"bracket|number"):
        expand_hostlist(expression)
    assert not in_hostlist("n1", expression)


NUMBERS = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 4), st.sampled_from([1, 2, 3])),
    min_size=1,
    max_size=3,
)
TOKENS = st.tuples(
    st.sampled_from(["n", "gpu-", "r1i", ""]),
    st.lists(st.tuples(NUMBERS, st.sampled_from(["", "n", "-x", "0"])), max_size=3),
)


def written(token: tuple[str, list[tuple[list[tuple[int, int, int]], str]]]) -> str:
    head, brackets = token
    text = head
    for position, (ranges, after) in enumerate(brackets):
        parts = [
            f"{low:0{width}d}" + (f"-{low + span}" if span else "") for low, span, width in ranges
        ]
        text += "[" + ",".join(parts) + "]" + (after if position < len(brackets) - 1 else "")
    return text or "x"


@given(st.lists(TOKENS, min_size=1, max_size=3), st.data())
def test_a_name_is_found_exactly_when_the_expansion_lists_it(
    tokens: list[tuple[str, list[tuple[list[tuple[int, int, int]], str]]]], data: st.DataObject
) -> None:
    # GIVEN a hostlist, and a name from its expansion or a near miss
    expression = ",".join(written(token) for token in tokens)
    names = expand_hostlist(expression)
    name = data.draw(st.sampled_from(names) | st.sampled_from(names).map(lambda n: n + "0"))
    # THEN looking for the name without expanding agrees with the expansion
    assert in_hostlist(name, expression) == (name in names)
