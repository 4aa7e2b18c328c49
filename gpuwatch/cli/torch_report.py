"""`gpuwatch torch-report FILE`: an OOM report, or a memory snapshot summed up, in the terminal.

The file may come from anyone, and may be anything: it is read by
`gpuwatch.paths.read_regular_file`, and refused at once unless it is a regular file of a size
gpuwatch could have written. Its first bytes say what it is before the rest is read.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import click

from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command
from gpuwatch.errors import InvalidValueError, UnreadableFileError
from gpuwatch.paths import RegularFile, open_regular_file
from gpuwatch.record_fields import BadRecord
from gpuwatch.reports.memsnapshot import MAX_FILE_BYTES, NotASnapshot, load, summarize
from gpuwatch.reports.oom import MAX_REPORT_BYTES, TEXT_START, read_text, render, report_from_dict
from gpuwatch.reports.training import FORMAT as TRAINING_FORMAT

_WHAT_TO_GIVE = "give the .json or .pickle that gpuwatch.torch.watch() wrote"


@click.command("torch-report", cls=Command, short_help=short_help("torch-report"))
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True))
def torch_report(file: str) -> int:
    """Show an OOM report written by gpuwatch.torch.watch() (the .json, or its .txt copy), or
    summarise a CUDA memory snapshot (the .pickle for pytorch.org/memory_viz)."""
    with _open_regular(file) as opened:
        head, size_bytes = opened.read_head(64), opened.status.st_size
        if head.startswith(b"\x80"):  # a pickle, protocol 2 or later: what torch writes
            click.echo(_snapshot_summary(file, head + opened.read()))
        elif head.lstrip().startswith(b"{"):
            click.echo(_json_report(file, head, opened))
        elif head.startswith(TEXT_START.encode()) and size_bytes <= MAX_REPORT_BYTES:
            click.echo(read_text(head + opened.read(MAX_REPORT_BYTES - len(head))), nl=False)
        else:
            raise InvalidValueError(
                f"{file} is neither a gpuwatch OOM report nor a memory snapshot; {_WHAT_TO_GIVE}"
            )
    return 0


@contextlib.contextmanager
def _open_regular(path: str) -> Iterator[RegularFile]:
    """`path` open for reading, if it is a regular file no larger than a snapshot may be
    (`gpuwatch.paths.read_regular_file`: a device is refused unopened, a FIFO without waiting); what
    keeps it from being read, then or while it is, said in one line."""
    try:
        with open_regular_file(path, MAX_FILE_BYTES) as opened:
            yield opened
    except UnreadableFileError as error:
        if error.kind is not None:
            raise InvalidValueError(f"{path} is not a regular file; {_WHAT_TO_GIVE}") from None
        if error.max_bytes == MAX_FILE_BYTES:
            raise InvalidValueError(
                f"{path} is larger than any report or snapshot (4 GiB); {_WHAT_TO_GIVE}"
            ) from None
        raise InvalidValueError(f"cannot read {path}: {error}") from None


def _json_report(file: str, head: bytes, opened: RegularFile) -> str:
    try:
        if opened.status.st_size > MAX_REPORT_BYTES:
            raise BadRecord("larger than any OOM report gpuwatch writes")
        data = json.loads(head + opened.read(MAX_REPORT_BYTES - len(head)))
        if isinstance(data, dict) and data.get("format") == TRAINING_FORMAT:
            raise InvalidValueError(
                f"{file} is a live training report, not an OOM report: `gpuwatch tui` shows "
                "those (its training panel), and the daemon serves them at /v1/training; give "
                "the gpuwatch-oom-*.json of an OOM here"
            )
        return render(report_from_dict(data))
    except (ValueError, RecursionError) as error:
        if isinstance(error, InvalidValueError):
            raise
        why = str(error) if isinstance(error, BadRecord) else "not JSON"
        raise InvalidValueError(
            f"{file} is neither a gpuwatch OOM report ({why}) nor a memory snapshot; "
            f"{_WHAT_TO_GIVE}"
        ) from error


def _snapshot_summary(file: str, raw: bytes) -> str:
    try:
        return summarize(load(raw)).render()
    except NotASnapshot as error:
        raise InvalidValueError(
            f"{file} is neither a gpuwatch OOM report nor a memory snapshot ({error}); "
            f"{_WHAT_TO_GIVE}"
        ) from error
