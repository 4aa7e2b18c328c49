"""Slurm's configuration files read as Slurm's own parser reads them: comments, escapes,
continued lines, quoted values, keys in any case, and `include`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.jobs.slurm_config import (
    MAX_INCLUDE_DEPTH,
    SlurmConfigError,
    logical_lines,
    read_config,
)


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        pytest.param(
            "Name=gpu File=/dev/nvidia0 # a comment\n",
            ["Name=gpu File=/dev/nvidia0 "],
            id="comment",
        ),
        pytest.param(
            "Name=gpu \\\n  File=/dev/nvidia1\n", ["Name=gpu   File=/dev/nvidia1"], id="continued"
        ),
        pytest.param(
            "Name=gpu \\ # why\nFile=x\n", ["Name=gpu File=x"], id="continued-before-a-comment"
        ),
        pytest.param("Comment=a\\#b\n", ["Comment=a#b"], id="escaped-hash"),
        pytest.param("A=1\\\\\nB=2\n", ["A=1\\", "B=2"], id="escaped-backslash-does-not-continue"),
        pytest.param("\n  \n# only\n", ["  "], id="blank-and-comment"),
    ],
)
def test_logical_lines(text: str, lines: list[str]) -> None:
    assert [line for _, line in logical_lines(text)] == lines


def test_keys_in_any_case_and_quoted_values(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text('nodename=a\tNAME=gpu  Comment="two words" file=/dev/nvidia0\n')
    (line,) = read_config(conf)
    assert line.first_key == "nodename"
    assert (line.get("Name"), line.get("Comment"), line.get("FILE")) == (
        "gpu",
        "two words",
        "/dev/nvidia0",
    )


def test_text_that_is_no_key_value_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text("Name=gpu\nRDGPU01: GPU02\n")
    with pytest.raises(SlurmConfigError, match=r"gres.conf:2"):
        read_config(conf)


def test_includes_are_read_in_their_place(tmp_path: Path) -> None:
    # GIVEN a file including one beside it, which includes one by absolute path
    (tmp_path / "sub").mkdir()
    (tmp_path / "gres.conf").write_text("A=1\nInclude sub/one.conf\nD=4\n")
    (tmp_path / "sub" / "one.conf").write_text(f"B=2\ninclude {tmp_path}/two.conf\n")
    (tmp_path / "two.conf").write_text("C=3\n")
    # WHEN read THEN the lines come in order
    lines = read_config(tmp_path / "gres.conf")
    assert [line.pairs[0][0] for line in lines] == ["A", "B", "C", "D"]


def test_an_include_that_two_slurm_versions_read_differently_is_refused(tmp_path: Path) -> None:
    # GIVEN sub/a.conf including b.conf, where both sub/b.conf (22.05: beside the including
    # file) and b.conf (23.02 on: beside slurm.conf) exist
    (tmp_path / "sub").mkdir()
    (tmp_path / "gres.conf").write_text("include sub/a.conf\n")
    (tmp_path / "sub" / "a.conf").write_text("include b.conf\n")
    (tmp_path / "sub" / "b.conf").write_text("A=1\n")
    (tmp_path / "b.conf").write_text("A=2\n")
    # THEN which one slurmd read is not known: refused, saying so
    with pytest.raises(SlurmConfigError, match=r"22\.05 and older"):
        read_config(tmp_path / "gres.conf", slurm_conf=tmp_path / "slurm.conf")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("include self.conf\n", f"more than {MAX_INCLUDE_DEPTH} deep", id="loop"),
        pytest.param("include /etc/slurm/gres.d/*\n", "no glob", id="glob"),
        pytest.param("include missing.conf\n", "cannot read", id="missing"),
    ],
)
def test_includes_slurmd_would_not_read(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "self.conf").write_text(text)
    with pytest.raises(SlurmConfigError, match=why):
        read_config(tmp_path / "self.conf")
