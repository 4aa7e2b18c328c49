"""Reading a file that another user or machine may have written: a regular file only, and
bounded in bytes. Every such reader in gpuwatch goes through here.

- No device is opened, and nothing blocks: the path is looked at (`stat`) before it is
  opened, so that a device is refused unopened (opening one can act: a tape rewinds, a
  terminal becomes the controlling one); it is opened with `O_NONBLOCK`, since a FIFO
  opened to read waits for a writer, for good if none comes; and the open file is looked at
  again (`fstat`), so that nothing swapped in between is read.
- At most `max_bytes` are read: a file past its cap is refused, saying "larger than X",
  never read in part, unless the caller asks for the head of a file (`RegularFile.read_head`,
  to tell what a file is by its first bytes).
- `O_CLOEXEC` (no command started meanwhile inherits the file) and `O_NOCTTY`; with
  `follow_symlinks=False` a symlink is refused (`lstat`, then `O_NOFOLLOW`), where a link
  would let its writer point the reader elsewhere (the lease directory, the jobs cache).

Every refusal is an `UnreadableFileError` whose message says what was wrong, without the
path, which each caller words into its own one-line message.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from gpuwatch.errors import UnreadableFileError
from gpuwatch.units import format_size

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK_BYTES = 64 << 10  # what a read asks for beyond the size the file had when opened
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symlink",
}


class RegularFile:
    """A regular file, open for reading and checked: its `status` (as `fstat` says) and
    what is left of it to read, at most `max_bytes` in all."""

    def __init__(self, fd: int, status: os.stat_result, max_bytes: int) -> None:
        self.fd = fd
        self.status = status
        self.max_bytes = max_bytes
        self._offset = 0

    def read(self, max_bytes: int | None = None) -> bytes:
        """The rest of the file; `UnreadableFileError` ("larger than X") where it holds more
        than `max_bytes` (by default, what is left of the file's cap)."""
        cap = self.max_bytes - self._offset if max_bytes is None else max_bytes
        data = self._read_up_to(cap + 1)
        if len(data) > cap:
            raise too_large(cap)
        return data

    def read_head(self, size_bytes: int) -> bytes:
        """The next `size_bytes` of the file, or fewer where it ends first: the head of a
        file, cut short on purpose."""
        return self._read_up_to(min(size_bytes, self.max_bytes - self._offset))

    def _read_up_to(self, size_bytes: int) -> bytes:
        # The first read asks for the size the file had, and one byte more: a file read whole
        # in one call, into one buffer no larger than the file, however large the cap.
        chunks, left = [], size_bytes
        want = max(self.status.st_size - self._offset + 1, _CHUNK_BYTES)
        try:
            while left > 0 and (chunk := os.read(self.fd, min(left, want))):
                chunks.append(chunk)
                left -= len(chunk)
                want = _CHUNK_BYTES
        except OSError as error:
            raise _refusal(error) from None
        self._offset += size_bytes - left
        return b"".join(chunks)


def read_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True
) -> bytes:
    """All of the regular file at `path`, at most `max_bytes`; `UnreadableFileError` saying
    why not (missing, forbidden, no regular file, a symlink not followed, larger)."""
    with open_regular_file(path, max_bytes, follow_symlinks=follow_symlinks) as file:
        return file.read()


@contextmanager
def open_regular_file(
    path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True
) -> Iterator[RegularFile]:
    """The regular file at `path`, open for as long as the block runs, for a caller that
    looks at its status (its owner, its size) or locks it before reading, or reads its head.

    Refused (`UnreadableFileError`) before anything is read where it is missing, forbidden,
    no regular file, a symlink not to be followed, or larger than `max_bytes` already.
    """
    try:
        _check(os.stat(path, follow_symlinks=follow_symlinks), max_bytes)
        fd = os.open(path, _OPEN_FLAGS if follow_symlinks else _OPEN_FLAGS | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow_symlinks:  # swapped in after the lstat
            raise UnreadableFileError("a symlink, not a regular file", kind="a symlink") from None
        raise _refusal(error) from None
    try:
        status = os.fstat(fd)
        _check(status, max_bytes)
        yield RegularFile(fd, status, max_bytes)
    finally:
        os.close(fd)


def too_large(max_bytes: int) -> UnreadableFileError:
    """The refusal of a file over its cap: "larger than 1MiB"."""
    return UnreadableFileError(
        f"larger than {format_size(max_bytes, precision=0)}", max_bytes=max_bytes
    )


def _check(status: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        kind = _KINDS.get(stat.S_IFMT(status.st_mode), "a special file")
        raise UnreadableFileError(f"{kind}, not a regular file", kind=kind)
    if status.st_size > max_bytes:
        raise too_large(max_bytes)


def _refusal(error: OSError) -> UnreadableFileError:
    """The system's error in its own words: "Permission denied"."""
    return UnreadableFileError(error.strerror or str(error), errno=error.errno)
