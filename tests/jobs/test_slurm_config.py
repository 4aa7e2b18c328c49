"""Slurm's configuration files read as Slurm's own parser reads them: comments, escapes,
continued lines, quoted values, keys in any case, and `include`."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.jobs.slurm_config import (
    MAX_INCLUDE_DEPTH,
    MAX_TOTAL_BYTES,
    SlurmConfigError,
    logical_lines,
    read_config,
)
from tests.helpers.other_user import other_user_ids, python_as

DEADLINE_S = 30.0  # generous: the test machine's cores are shared


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
    (line,) = list(read_config(conf))
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
        list(read_config(conf))


def test_includes_are_read_in_their_place(tmp_path: Path) -> None:
    # GIVEN a file including one beside it, which includes one by absolute path
    (tmp_path / "sub").mkdir()
    (tmp_path / "gres.conf").write_text("A=1\nInclude sub/one.conf\nD=4\n")
    (tmp_path / "sub" / "one.conf").write_text(f"B=2\ninclude {tmp_path}/two.conf\n")
    (tmp_path / "two.conf").write_text("C=3\n")
    # WHEN read THEN the lines come in order
    lines = list(read_config(tmp_path / "gres.conf"))
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
        list(read_config(tmp_path / "gres.conf", slurm_conf=tmp_path / "slurm.conf"))


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
        list(read_config(tmp_path / "self.conf"))


def within_deadline(read: Callable[[], object]) -> BaseException | object:
    """What `read` returned or raised, run on a thread that must end within `DEADLINE_S`."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(read())
        except Exception as error:
            outcome.append(error)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(DEADLINE_S)
    assert not reader.is_alive(), "the reader is still reading"
    return outcome[0]


def one_line(outcome: object, *words: str) -> str:
    assert isinstance(outcome, SlurmConfigError), outcome
    message = str(outcome)
    assert "\n" not in message and all(word in message for word in words), message
    return message


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(os.mkfifo, "a FIFO", id="fifo"),
        pytest.param(os.mkdir, "a directory", id="directory"),
        pytest.param(
            lambda path: os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5)),
            "a character device",
            id="device-zero",
        ),
    ],
)
def test_an_include_that_is_no_regular_file_is_one_line_at_once(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    if kind == "a character device" and os.geteuid() != 0:
        pytest.skip("mknod needs root")
    # GIVEN gres.conf including a FIFO nobody writes, a directory, or /dev/zero's twin
    make(tmp_path / "gpus.conf")
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\ninclude gpus.conf\n")
    # WHEN read THEN it ends at once, naming the file and what it is
    outcome = within_deadline(lambda: list(read_config(tmp_path / "gres.conf")))
    one_line(outcome, str(tmp_path / "gpus.conf"), kind, "not a regular file")


def test_an_include_tree_past_the_byte_cap_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    # GIVEN gres.conf including 63 files of 1 MB each (the configuration of no cluster)
    line = "NodeName=n[0-9] Name=gpu File=/dev/nvidia[0-3]\n"
    part = line * ((1 << 20) // len(line))
    for number in range(63):
        (tmp_path / f"part{number}.conf").write_text(part)
    (tmp_path / "gres.conf").write_text(
        "".join(f"include part{number}.conf\n" for number in range(63))
    )
    # WHEN read
    tracemalloc.start()
    try:
        outcome = within_deadline(lambda: list(read_config(tmp_path / "gres.conf")))
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN it is refused, naming the cap, having held little more than the cap
    one_line(outcome, f"more than {MAX_TOTAL_BYTES} bytes")
    assert peak_bytes < 8 * MAX_TOTAL_BYTES


def test_an_include_tree_within_the_cap_is_read_whole(tmp_path: Path) -> None:
    # GIVEN a gres.conf including a file of comments that brings the tree just under the cap
    comments = "#" * 99 + "\n"
    (tmp_path / "notes.conf").write_text(comments * ((MAX_TOTAL_BYTES - 4096) // 100))
    (tmp_path / "gres.conf").write_text("include notes.conf\nName=gpu File=/dev/nvidia0\n")
    # THEN it reads as before
    lines = list(read_config(tmp_path / "gres.conf"))
    assert [line.get("File") for line in lines] == ["/dev/nvidia0"]


def test_a_configuration_another_user_may_not_read_is_permission_denied(tmp_path: Path) -> None:
    # GIVEN a gres.conf only root may read, and one in a folder only root may enter
    uid, gid = other_user_ids()
    public = Path(tempfile.mkdtemp(prefix="gpuwatch-conf-"))
    try:
        public.chmod(0o755)
        (public / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\n")
        (public / "gres.conf").chmod(0o600)
        (public / "private").mkdir(mode=0o700)
        (public / "private" / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\n")
        (public / "outer.conf").write_text("include private/gres.conf\n")
        (public / "outer.conf").chmod(0o644)
        # WHEN the other user looks for a slurm.conf in the folder it may not enter
        hidden = str(public / "private" / "slurm.conf")
        code = (
            "from gpuwatch.jobs.slurm_places import configured_slurm_conf\n"
            f"print(configured_slurm_conf({{}}, places=[{hidden!r}]))\n"
        )
        found = python_as(uid, gid, code)
        # THEN it is taken as there (reading it will say why not), never as no Slurm at all
        assert found.stdout.strip() == hidden, found
        # WHEN the other user reads them THEN each says "permission denied", not "not found"
        for path in (public / "gres.conf", public / "outer.conf"):
            code = (
                "from pathlib import Path\n"
                "from gpuwatch.jobs.slurm_config import SlurmConfigError, read_config\n"
                f"try:\n    list(read_config(Path({str(path)!r})))\n"
                "except SlurmConfigError as error:\n    print(error)\n"
            )
            done = python_as(uid, gid, code)
            assert "permission denied" in done.stdout, done
    finally:
        shutil.rmtree(public, ignore_errors=True)
