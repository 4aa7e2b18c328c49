"""Playing another local user: commands run as `nobody` (or $GPUWATCH_TEST_USER) via setpriv.

Only root can switch users; elsewhere, and where no such user exists, the tests
that need one are skipped.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.wait import wait_for

USER = os.environ.get("GPUWATCH_TEST_USER", "nobody")


def other_user() -> pwd.struct_passwd:
    """The other user, or a skip saying why there is none."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("playing another user needs root and setpriv")
    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER!r} to play (set GPUWATCH_TEST_USER)")
    if entry.pw_uid == 0:
        pytest.skip(f"{USER!r} is root, not another user")
    return entry


def as_other_user(argv: Sequence[str]) -> list[str]:
    entry = other_user()
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--",
        *argv,
    ]


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
            wait_for(lambda: ready.exists() or process.poll() is not None, f"{ready} to appear")
            assert process.poll() is None, f"{argv} ended early"
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
