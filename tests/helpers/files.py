"""What a path holds, as a test that checks a path was "left alone" compares it: the kind of
thing, its inode, owner and mode, where a link points, a file's bytes, a directory's names.
Never its times: reading a link or a file moves its access time (`relatime` updates it at
the first read after a change), and that is no change anyone made.

    before = what_is_at(path)
    ...  # the command refuses the path
    assert what_is_at(path) == before
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Held:
    """What a path holds; `None` for what its kind has not (a FIFO is never opened)."""

    inode: int
    mode: int
    """The kind of thing and its permissions (`st_mode`)."""
    owner: tuple[int, int]
    link_target: str | None = None
    content: bytes | None = None
    names: tuple[str, ...] | None = None
    """A directory's entries."""


def what_is_at(path: str | os.PathLike[str]) -> Held:
    """What `path` itself holds (a symbolic link is not followed)."""
    info = os.lstat(path)
    held = Held(info.st_ino, info.st_mode, (info.st_uid, info.st_gid))
    if stat.S_ISLNK(info.st_mode):
        return Held(held.inode, held.mode, held.owner, link_target=os.readlink(path))
    if stat.S_ISREG(info.st_mode):
        return Held(held.inode, held.mode, held.owner, content=Path(path).read_bytes())
    if stat.S_ISDIR(info.st_mode):
        return Held(held.inode, held.mode, held.owner, names=tuple(sorted(os.listdir(path))))
    return held
