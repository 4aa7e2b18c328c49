"""`gpuwatch torch-report FILE`: an OOM report, or a memory snapshot summed up, in the terminal."""

from __future__ import annotations

import click

from gpuwatch.errors import InvalidValueError
from gpuwatch.memsnapshot import MAX_FILE_BYTES, NotASnapshot, load, summarize
from gpuwatch.oomreport import read_report, render
from gpuwatch.record_fields import BadRecord


@click.command("torch-report", short_help="Show an OOM report or summarise a memory snapshot.")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True))
def torch_report(file: str) -> int:
    """Show an OOM report written by gpuwatch.torch.watch() (the .json), or summarise a
    CUDA memory snapshot (the .pickle for pytorch.org/memory_viz)."""
    try:
        click.echo(render(read_report(file)))
        return 0
    except BadRecord as error:
        report_error = str(error)
    except OSError as error:
        raise InvalidValueError(f"cannot read {file}: {error.strerror}") from error
    try:
        with open(file, "rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise NotASnapshot("larger than 4 GiB")
        click.echo(summarize(load(raw)).render())
    except (NotASnapshot, OSError) as error:
        raise InvalidValueError(
            f"{file} is neither a gpuwatch OOM report ({report_error}) nor a memory snapshot "
            f"({error}); give the .json or .pickle that gpuwatch.torch.watch() wrote"
        ) from error
    return 0
