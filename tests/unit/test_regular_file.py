"""The one reader of files another user or machine may have written: regular files only,
bounded, never blocking, never opening a device."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.errors import UnreadableFileError
from gpuwatch.paths import open_regular_file, read_regular_file
from tests.helpers.other_user import other_user_ids, python_as

CAP_BYTES = 1 << 10


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo")  # nobody writes: an open() to read would wait for good
    return str(tmp_path / "fifo")


def _socket(tmp_path: Path) -> str:
    import socket

    path = str(tmp_path / "sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.close()
    return path


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        pytest.param(_fifo, "a FIFO", id="fifo"),
        pytest.param(lambda tmp_path: "/dev/zero", "a character device", id="dev-zero"),
        pytest.param(lambda tmp_path: "/dev/null", "a character device", id="dev-null"),
        pytest.param(str, "a directory", id="directory"),
        pytest.param(_socket, "a socket", id="socket"),
    ],
)
def test_anything_but_a_regular_file_is_refused_saying_what_it_is(
    tmp_path: Path, make: Callable[[Path], str], kind: str
) -> None:
    # GIVEN a FIFO nobody writes to, a device, a directory or a socket
    path = make(tmp_path)
    # WHEN it is read THEN it is refused at once, naming what it is
    with pytest.raises(UnreadableFileError) as refused:
        read_regular_file(path, CAP_BYTES)
    assert str(refused.value) == f"{kind}, not a regular file"
    assert refused.value.kind == kind
    assert not refused.value.missing


def test_a_device_is_refused_without_being_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a device node (opening one can act: a tape rewinds, a terminal is taken), and
    # a symlink to it
    (tmp_path / "link").symlink_to("/dev/zero")
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    for path in ("/dev/zero", str(tmp_path / "link")):
        # WHEN it is read
        with pytest.raises(UnreadableFileError, match=r"^a character device, not a regular file$"):
            read_regular_file(path, CAP_BYTES)
    # THEN it was never opened
    assert opened == []


def test_a_symlink_is_followed_unless_the_caller_refuses_links(tmp_path: Path) -> None:
    # GIVEN a symlink to a regular file
    (tmp_path / "target").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    # WHEN it is read following links THEN the target's bytes come back
    assert read_regular_file(tmp_path / "link", CAP_BYTES) == b"data"
    # WHEN a caller that refuses links reads it THEN it is refused as a symlink
    with pytest.raises(UnreadableFileError) as refused:
        read_regular_file(tmp_path / "link", CAP_BYTES, follow_symlinks=False)
    assert str(refused.value) == "a symbolic link, not a regular file"
    assert refused.value.kind == "a symbolic link"


@pytest.mark.parametrize(
    ("size_bytes", "fits"),
    [
        pytest.param(CAP_BYTES, True, id="at-the-cap"),
        pytest.param(CAP_BYTES + 1, False, id="one-byte-over"),
        pytest.param(0, True, id="empty"),
    ],
)
def test_a_file_over_its_cap_is_refused_never_cut_short(
    tmp_path: Path, size_bytes: int, fits: bool
) -> None:
    # GIVEN a file of the cap's size, one byte over it, or empty
    path = tmp_path / "file"
    path.write_bytes(b"x" * size_bytes)
    # WHEN it is read THEN it comes back whole, or is refused naming the cap
    if fits:
        assert read_regular_file(path, CAP_BYTES) == b"x" * size_bytes
        return
    with pytest.raises(UnreadableFileError) as refused:
        read_regular_file(path, CAP_BYTES)
    assert str(refused.value) == "larger than 1KiB"
    assert refused.value.max_bytes == CAP_BYTES


def test_a_file_that_grows_past_its_cap_once_open_is_refused(tmp_path: Path) -> None:
    # GIVEN a file within its cap when opened
    path = tmp_path / "file"
    path.write_bytes(b"x" * 10)
    with open_regular_file(path, CAP_BYTES) as file:
        # WHEN its writer makes it larger than the cap before it is read
        path.write_bytes(b"x" * (CAP_BYTES + 1))
        # THEN reading it is refused, not cut at the cap
        with pytest.raises(UnreadableFileError, match="larger than 1KiB"):
            file.read()


def test_the_head_of_a_file_is_read_only_when_asked_for(tmp_path: Path) -> None:
    # GIVEN a file of many bytes, under a cap
    path = tmp_path / "file"
    path.write_bytes(b"head" + b"x" * 100)
    with open_regular_file(path, CAP_BYTES) as file:
        # WHEN its head is read, then the rest under a smaller cap than the file's
        head = file.read_head(4)
        # THEN the head is the first bytes, and the rest is refused past its own cap
        assert head == b"head"
        with pytest.raises(UnreadableFileError, match="larger than 99B"):
            file.read(99)
        assert file.status.st_size == 104


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    # GIVEN no file, and a path through a regular file
    (tmp_path / "plain").write_text("")
    for path in (tmp_path / "gone", tmp_path / "plain" / "below"):
        # WHEN it is read THEN the error says it is missing, in the system's words
        with pytest.raises(UnreadableFileError) as refused:
            read_regular_file(path, CAP_BYTES)
        assert refused.value.missing
        assert str(refused.value) in ("No such file or directory", "Not a directory")


def test_a_file_another_user_may_not_read_is_permission_denied() -> None:
    # GIVEN a file only its owner may read, in a folder everyone may enter
    uid, gid = other_user_ids()
    public = Path(tempfile.mkdtemp(prefix="gpuwatch-regular-file-"))
    try:
        public.chmod(0o755)
        (public / "private").write_text("secret\n")
        (public / "private").chmod(0o600)
        # WHEN another user reads it
        code = (
            "from gpuwatch.errors import UnreadableFileError\n"
            "from gpuwatch.paths import read_regular_file\n"
            f"try:\n    read_regular_file({str(public / 'private')!r}, 1024)\n"
            "except UnreadableFileError as error:\n    print(error, error.missing)\n"
        )
        done = python_as(uid, gid, code)
        # THEN it is refused as forbidden, never as missing
        assert done.stdout.strip() == "Permission denied False", done
    finally:
        shutil.rmtree(public, ignore_errors=True)


def test_no_descriptor_is_left_open_or_inherited(tmp_path: Path) -> None:
    # GIVEN a regular file
    path = tmp_path / "file"
    path.write_bytes(b"data")
    # WHEN it is open THEN a command started meanwhile would not inherit it
    with open_regular_file(path, CAP_BYTES) as file:
        assert not os.get_inheritable(file.fd)
        fd = file.fd
    # AND once read, its descriptor is closed
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
