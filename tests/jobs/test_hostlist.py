"""Slurm's hostlists, expanded as Slurm's own `scontrol show hostnames` expands them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatch.jobs.hostlist import HostlistError, expand_hostlist, in_hostlist

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
