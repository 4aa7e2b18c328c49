"""The `gpuwatch` command. `main()` is the one place errors become messages and exit codes.

Every failure ends in one line on stderr, `gpuwatch: error: ...` (for a pick
that found too few GPUs, followed by one indented line per GPU), and a code
from `ExitCode`. A traceback is shown only for a bug, and only with
`GPUWATCH_DEBUG=1`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import click

from gpuwatch.cli.exit_codes import ExitCode, exit_code_for
from gpuwatch.cli.group import cli
from gpuwatch.cli.terminal import help_width, reader_gone
from gpuwatch.errors import DriverNotFoundError, GpuwatchError, NotEnoughGpusError
from gpuwatch.text import printable

_NO_GPU_HINT = "; try --sim 4 to explore gpuwatch without a GPU"


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Runs the command line and exits with its code."""
    args = list(sys.argv[1:] if argv is None else argv) or ["--help"]
    sys.exit(_reporting_errors(lambda: _run_click(args)))


def _run_click(args: list[str]) -> int:
    """Runs `gpuwatch ARGS`; click's own errors become a message and an exit code here.

    The group is run as click's `main()` runs it, less its handling of errors: click
    would turn a reader that went away into exit status 1, and Ctrl-C into `Abort`.
    """
    try:
        with cli.make_context("gpuwatch", args, terminal_width=help_width()) as ctx:
            result = cli.invoke(ctx)
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except click.UsageError as error:
        # click gives no context for some errors (an option without its value)
        named = args[:1] if args[:1] and not args[0].startswith("-") else []
        command = error.ctx.command_path if error.ctx else " ".join(["gpuwatch", *named])
        message = error.format_message().rstrip(".")
        return fail(f"{message} (see '{command} --help')", ExitCode.USAGE)
    except click.Abort:  # a prompt's Ctrl-C
        return ExitCode.INTERRUPTED
    except click.ClickException as error:
        return fail(error.format_message(), error.exit_code)
    return result if isinstance(result, int) else ExitCode.OK


def _reporting_errors(command: Callable[[], int]) -> int:
    """Runs `command`, turning every other way it can fail into a message and an exit code."""
    try:
        return command()
    except GpuwatchError as error:
        # Only a missing driver is helped by simulating: no GPU left by CUDA_VISIBLE_DEVICES
        # or --exclude would be the same on a simulated node.
        hint = _NO_GPU_HINT if isinstance(error, DriverNotFoundError) else ""
        if isinstance(error, NotEnoughGpusError):  # each reason on a line of its own
            return fail(error.summary, exit_code_for(error), details=error.reasons)
        return fail(f"{error}{hint}", exit_code_for(error))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except Exception as error:
        if os.environ.get("GPUWATCH_DEBUG"):
            raise
        return fail(
            f"unexpected {type(error).__name__}: {error} (GPUWATCH_DEBUG=1 shows where)",
            ExitCode.FAILED,
        )


def fail(message: str, code: int, *, details: Sequence[str] = ()) -> int:
    """Prints `gpuwatch: error: MESSAGE` (and indented details) to stderr; returns `code`.

    Messages quote what they were given (file names, values, lease records), which
    may hold escape sequences: those are shown as `?`.
    """
    lines = [f"gpuwatch: error: {message}", *(f"  {detail}" for detail in details)]
    lines = [printable(line) for line in lines]
    sys.stderr.write("\n".join(lines) + "\n")
    return code
