"""The check that a path was left alone (`tests.helpers.files.what_is_at`) sees every change
a command could make to it, and none that only reading it makes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.files import what_is_at


def _link(path: Path) -> None:
    (path.parent / "elsewhere").mkdir()
    path.symlink_to(path.parent / "elsewhere")


def _file(path: Path) -> None:
    path.write_text("precious\n")


def _directory(path: Path) -> None:
    path.mkdir()
    (path / "kept").write_text("")


def _file_beside(path: Path) -> Path:
    """The same bytes as the file planted, in another file."""
    beside = path.with_name("beside")
    beside.write_text("precious\n")
    return beside


PLANTED = {"symlink": _link, "file": _file, "directory": _directory, "fifo": os.mkfifo}


@pytest.mark.parametrize("plant", PLANTED.values(), ids=PLANTED)
def test_times_moved_by_reading_are_no_change(
    tmp_path: Path, plant: Callable[[Path], object]
) -> None:
    # GIVEN something at a path, as a test found it
    path = tmp_path / "planted"
    plant(path)
    before = what_is_at(path)
    # WHEN it is read, and its access and modification times move
    what_is_at(path)
    os.utime(path, ns=(1, 2), follow_symlinks=False)
    # THEN it is what it was
    assert what_is_at(path) == before


CHANGES = {
    "link-retargeted": (_link, lambda p: (p.unlink(), p.symlink_to("/etc"))),
    "file-rewritten": (_file, lambda p: p.write_text("changed\n")),
    "mode-changed": (_file, lambda p: p.chmod(0o600)),
    "replaced": (_file, lambda p: os.replace(_file_beside(p), p)),
    "entry-added": (_directory, lambda p: (p / "new").write_text("")),
}


@pytest.mark.parametrize(("plant", "change"), CHANGES.values(), ids=CHANGES)
def test_every_change_a_command_could_make_is_seen(
    tmp_path: Path, plant: Callable[[Path], object], change: Callable[[Path], object]
) -> None:
    # GIVEN something at a path, WHEN it is changed, THEN the change is seen
    path = tmp_path / "planted"
    plant(path)
    before = what_is_at(path)
    change(path)
    assert what_is_at(path) != before
