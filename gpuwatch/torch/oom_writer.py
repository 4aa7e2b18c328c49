"""Writing the out-of-memory report: facts gathered at the error, files, and a word on stderr.

Runs inside torch's OOM observer (or, when that was not attached yet, as the
error leaves the watched block), so it does little: the allocator's counters,
the last sampled step's modules, the largest live tensors of the device (one
pass over the garbage collector's objects, once), and, when history recording
is on, a snapshot for pytorch.org/memory_viz. Files are named after host, pid
and rank, so ranks never overwrite each other, and are always created new, so
nobody else's file is ever overwritten either.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import secrets
import stat
import sys
from typing import Any, BinaryIO

from msgspec.structs import replace

from gpuwatch.errors import InvalidValueError
from gpuwatch.reports.oom import MAX_ITEMS, OomReport, TensorSize, render
from gpuwatch.reports.training import this_hostname
from gpuwatch.units import parse_size

_NAME_ATTEMPTS = 8


def largest_tensors(device_type: str, limit: int = 10) -> tuple[TensorSize, ...]:
    """The largest live tensors on devices of `device_type`, each storage once."""
    import torch  # here: importing gpuwatch.torch must not import torch

    seen: dict[int, TensorSize] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some proxies
        # (torch.distributed's deprecated names) answer with a warning.
        if not issubclass(type(obj), torch.Tensor):
            continue
        try:
            if obj.device.type != device_type:
                continue
            storage = obj.untyped_storage()
            pointer, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, ReferenceError):
            continue
        if pointer not in seen:
            seen[pointer] = TensorSize(str(tuple(obj.shape)), str(obj.dtype), nbytes)
    return tuple(sorted(seen.values(), key=lambda t: t.nbytes, reverse=True)[:limit])


def check_report_dir(path: str) -> None:
    """Refuses, as a usage error, an `oom_dir` that is not a directory (a file, a FIFO),
    or a symbolic link another user owns: it is created when missing, never replaced."""
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise InvalidValueError(f"oom_dir={path}: {error.strerror}") from error
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, os.geteuid()):
        raise InvalidValueError(
            f"oom_dir={path} is a symbolic link another user owns (to "
            f"{os.readlink(path)!r}): give a directory of your own"
        )
    try:
        target = os.stat(path)
    except OSError as error:
        raise InvalidValueError(f"oom_dir={path}: {error.strerror}") from error
    if not stat.S_ISDIR(target.st_mode):
        raise InvalidValueError(
            f"oom_dir={path} is {_kind(target.st_mode)}, not a directory: give a directory "
            "(it is created if missing)"
        )


def write_oom(report: OomReport, directory: str, snapshot: dict[str, Any] | None) -> str:
    """Writes the report as JSON and as text (and the snapshot as a pickle, the format
    memory_viz reads), prints the text to stderr, and returns the JSON's path.

    The names are predictable (host, pid, rank, step, time), and the directory may be
    shared: every file is created new, never through a link, and a name someone took
    first is passed over for a fresh one."""
    report = replace(report, modules=report.modules[:MAX_ITEMS], tensors=report.tensors[:MAX_ITEMS])
    try:
        check_report_dir(directory)
        os.makedirs(directory, exist_ok=True)
        stem, files = _create_files(directory, _stem(report), snapshot is not None)
    except (OSError, InvalidValueError):
        sys.stderr.write(f"gpuwatch.torch: {render(report)}\n")
        raise
    with files["json"], files["txt"]:
        if snapshot is not None:
            with files["pickle"]:
                pickle.dump(snapshot, files["pickle"])
            report = replace(report, snapshot_path=f"{stem}.pickle")
        files["json"].write(json.dumps(report.to_dict(), indent=1).encode())
        text = render(report)
        files["txt"].write(f"{text}\n".encode())
    sys.stderr.write(f"gpuwatch.torch: {text}\n(report: {stem}.txt)\n")
    return f"{stem}.json"


def _stem(report: OomReport) -> str:
    host = this_hostname().replace("/", "_")  # the kernel lets a host name hold one
    return f"gpuwatch-oom-{host}-{report.pid}-rank{report.rank}-step{report.step}-{int(report.at)}"


def _create_files(
    directory: str, name: str, with_snapshot: bool
) -> tuple[str, dict[str, BinaryIO]]:
    """Creates `name.json`, `name.txt` (and `name.pickle`) in `directory`, all new; when
    any of them exists already, another name, with a random part, is tried instead."""
    suffixes = ("json", "txt", "pickle") if with_snapshot else ("json", "txt")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for attempt in range(_NAME_ATTEMPTS):
            stem = name if attempt == 0 else f"{name}-{secrets.token_hex(4)}"
            created: dict[str, BinaryIO] = {}
            try:
                for suffix in suffixes:
                    fd = os.open(f"{stem}.{suffix}", flags, 0o644, dir_fd=dir_fd)
                    created[suffix] = os.fdopen(fd, "wb")
            except FileExistsError:
                for suffix, file in created.items():
                    file.close()
                    os.unlink(f"{stem}.{suffix}", dir_fd=dir_fd)
                continue
            return os.path.join(directory, stem), created
    finally:
        os.close(dir_fd)
    raise FileExistsError(f"{directory}: every name tried for the report was taken")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "a device")


def requested_from_message(message: str) -> int | None:
    """The size in torch's `Tried to allocate 2.00 GiB` message, in bytes."""
    words = message.split()
    for index, word in enumerate(words[:-2]):
        if word == "allocate":
            try:
                return parse_size(words[index + 1] + words[index + 2].rstrip(".;,)"))
            except InvalidValueError:
                return None
    return None
