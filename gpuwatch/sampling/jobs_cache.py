"""The last few seconds' answer of this node's Slurm, kept in a file of the user's own, so
that `gpuwatch status` run again and again asks Slurm at most every few seconds.

Asking squeue costs a one-shot status more than everything else it does (about 90 ms for
50 jobs on a two-core node); reading this file costs about a millisecond. The file lives in
`$XDG_RUNTIME_DIR` (the user's own tmpfs, mode 0700): without it, or where it is not the
user's own and private, there is no cache and each status asks Slurm.

The file is read as input another user could have planted: it must be a regular file of
this user, not writable by others, small, and a record of the right shape, written for the
same Slurm (command, `SLURM_CONF`, node) within its age. Anything else is ignored and
replaced. It is written to a temporary name, then renamed: a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable

from gpuwatch.errors import UnreadableFileError
from gpuwatch.jobs.job_table import MAX_WHY_CHARS, NodeJobs, table_from_record, table_record
from gpuwatch.jobs.kubelet_places import ENV_SOCKET
from gpuwatch.paths import open_regular_file
from gpuwatch.record_fields import BadRecord

FILE_NAME = "gpuwatch-jobs.json"
FORMAT = 1
KNOWN_AGE_S = 5.0
"""How long a table is taken from the file (the age `SlurmJobs` keeps its answer too)."""
UNKNOWN_AGE_S = 10.0
"""How long "jobs unknown" is: a Slurm that did not answer is not asked again by every
status of the next few seconds, each waiting out the deadline."""
MAX_FILE_BYTES = 8 << 20
_CLOCK_SKEW_S = 1.0


class JobsCache:
    """The cache file at `path`, for the Slurm named by `key`."""

    def __init__(self, path: str, key: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.key = key
        self._clock = clock

    @classmethod
    def for_this_user(cls) -> JobsCache | None:
        """The user's cache in `$XDG_RUNTIME_DIR`; `None` where there is no private one."""
        folder = os.environ.get("XDG_RUNTIME_DIR", "")
        if not folder or not _private(folder):
            return None
        return cls(os.path.join(folder, FILE_NAME), slurm_key())

    def load(self) -> NodeJobs | None:
        """The answer in the file, when it is believable and young enough; else `None`."""
        data = self._read()
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        written_at, record = data.get("written_at"), data.get("jobs")
        if data.get("key") != self.key or not _number(written_at):
            return None
        try:
            jobs = _jobs_of(record)
        except BadRecord:
            return None
        age_s = self._clock() - float(written_at)  # type: ignore[arg-type]  # _number
        fresh_s = KNOWN_AGE_S if jobs.table is not None else UNKNOWN_AGE_S
        return jobs if -_CLOCK_SKEW_S <= age_s < fresh_s else None

    def store(self, jobs: NodeJobs) -> None:
        """Writes `jobs` for the next few seconds' readers; a failure only loses the cache."""
        record = {
            "format": FORMAT,
            "key": self.key,
            "written_at": self._clock(),
            "jobs": table_record(jobs.table, error=jobs.unknown_why),
        }
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            descriptor = os.open(temporary, flags, 0o600)
            with os.fdopen(descriptor, "w") as file:
                json.dump(record, file, allow_nan=False)
            os.replace(temporary, self.path)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _read(self) -> object:
        """The cache's JSON, where it is this user's own private regular file (no symlink:
        its writer could point it elsewhere), at most `MAX_FILE_BYTES`; `None` for any other."""
        try:
            with open_regular_file(self.path, MAX_FILE_BYTES, follow_symlinks=False) as file:
                if not _own_private_file(file.status):
                    return None
                text = file.read()
        except UnreadableFileError:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _jobs_of(record: object) -> NodeJobs:
    """The answer a `table_record` holds; `BadRecord` for anything malformed."""
    table = table_from_record(record, strict=True)  # our own file: whole, or not ours
    if table is not None:
        return NodeJobs(table, None, scheduler=True)
    assert isinstance(record, dict)  # table_from_record checked
    why = record.get("error")
    if not isinstance(why, str) or not why.isprintable() or len(why) > MAX_WHY_CHARS:
        raise BadRecord("error: not a reason")
    return NodeJobs(None, why or "Slurm did not say", scheduler=True)


def _own_private_file(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _private(folder: str) -> bool:
    """A directory of this user's that nobody else may write to."""
    try:
        info = os.stat(folder)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def slurm_key() -> str:
    """Which engine an answer came from: the squeue on the PATH, `SLURM_CONF`, the node, the
    kubelet's socket."""
    parts = [
        os.environ.get("PATH", ""),
        os.environ.get("SLURM_CONF", ""),
        os.environ.get("SLURMD_NODENAME", ""),
        os.uname().nodename,
        os.environ.get(ENV_SOCKET, ""),
    ]
    return "\n".join(parts)
