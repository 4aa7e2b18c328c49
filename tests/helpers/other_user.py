"""Playing another local user: commands run as `nobody` (or $GPUWATCH_TEST_USER) via setpriv.

Only root can switch users; elsewhere, and where no such user exists, the tests
that need one are skipped.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.wait import wait_until

USER = os.environ.get("GPUWATCH_TEST_USER", "nobody")


def other_user() -> pwd.struct_passwd:
    """The other user (added when missing), or a skip saying why there is none."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("playing another user needs root and setpriv")
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            capture_output=True,
            check=False,
        )
        if made.returncode not in (0, 9):  # 9: added meanwhile by a test beside this one
            pytest.skip(f"no user {USER!r} to play: {made.stderr.decode().strip()}")
        entry = pwd.getpwnam(USER)
    if entry.pw_uid == 0:
        pytest.skip(f"{USER!r} is root, not another user")
    return entry


def other_user_ids() -> tuple[int, int]:
    """(uid, gid) of the other user, who must be able to run this gpuwatch; else a skip."""
    entry = other_user()
    if not _can_import_gpuwatch(entry.pw_uid, entry.pw_gid):
        pytest.skip(
            f"{USER} cannot import gpuwatch with {sys.executable} "
            "(make the virtual environment and the checkout readable by other users)"
        )
    return entry.pw_uid, entry.pw_gid


@functools.cache
def _can_import_gpuwatch(uid: int, gid: int) -> bool:
    probe = as_user(uid, gid, sys.executable, "-c", "import gpuwatch")
    return subprocess.run(probe, capture_output=True, check=False, cwd="/").returncode == 0


def as_user(uid: int, gid: int, *command: str) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *command]


def python_as(uid: int, gid: int, code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by this Python as the user `uid` (from `/`, which every user may enter);
    what it printed, and how it ended."""
    return subprocess.run(
        as_user(uid, gid, sys.executable, "-c", code),
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        timeout=60,
    )


def as_other_user(argv: Sequence[str]) -> list[str]:
    entry = other_user()
    return as_user(entry.pw_uid, entry.pw_gid, *argv)


@contextmanager
def public_lease_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A lease directory every user can reach (pytest's own tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gpuwatch-leases-"))
    path.chmod(0o1777)
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def holding(argv: Sequence[str], ready: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Runs `argv` (a lock holder) until the block ends; waits until `ready` exists.

    The whole process group goes at the end: a child that inherited the lock would keep it.
    """
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if ready is not None:
            wait_until(
                lambda: ready.exists() or process.poll() is not None,
                f"{ready} to appear",
                timeout_s=60,
                interval_s=0.02,
            )
            assert process.poll() is None, f"{argv} ended early"
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
