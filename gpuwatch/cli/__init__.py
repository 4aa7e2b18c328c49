"""The `gpuwatch` command. `main()` is the one place errors become messages and exit codes.

Every failure ends in one line on stderr, `gpuwatch: error: ...`, and a code
from `ExitCode`; a traceback is shown only for a bug, and only when
`GPUWATCH_DEBUG=1`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from gpuwatch.cli.app import cli
from gpuwatch.cli.exit_codes import ExitCode, exit_code_for
from gpuwatch.errors import DriverNotFoundError, GpuwatchError, NoGpuError

_NO_GPU_HINT = "; try --sim 4 to explore gpuwatch without a GPU"


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Runs the command line and exits with its code."""
    try:
        result = cli.main(args=argv, prog_name="gpuwatch", standalone_mode=False)
        code = result if isinstance(result, int) else ExitCode.OK
    except click.UsageError as error:
        code = _fail(_usage_message(error), ExitCode.USAGE)
    except GpuwatchError as error:
        hint = _NO_GPU_HINT if isinstance(error, DriverNotFoundError | NoGpuError) else ""
        code = _fail(f"{error}{hint}", exit_code_for(error))
    except (KeyboardInterrupt, click.Abort):
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`gpuwatch status --json --watch 1 | head -1`): not an error.
        _silence_stdout()
        code = ExitCode.OK
    except click.ClickException as error:
        code = _fail(error.format_message(), error.exit_code)
    except Exception as error:
        if os.environ.get("GPUWATCH_DEBUG"):
            raise
        code = _fail(
            f"unexpected {type(error).__name__}: {error} (GPUWATCH_DEBUG=1 shows where)",
            ExitCode.FAILED,
        )
    sys.exit(code)


def _usage_message(error: click.UsageError) -> str:
    command = error.ctx.command_path if error.ctx else "gpuwatch"
    return f"{error.format_message().rstrip('.')} (see '{command} --help')"


def _fail(message: str, code: int) -> int:
    click.echo(f"gpuwatch: error: {message}", err=True)
    return code


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
