"""What the commands share: the value types of their options, the options several commands
take, and the layout of help.

Every option's value is read by one of gpuwatch's own parsers (`gpuwatch.units`,
`gpuwatch.choices`), which raise `InvalidValueError` saying what is wrong; `Parsed` hands
that to click, which words it as `Invalid value for '--mem': '10' has no unit`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import click

from gpuwatch.backends import BACKEND_KINDS
from gpuwatch.cli._compat import AnyParamType
from gpuwatch.cli.terminal import definition_list, fit_line, paragraphs
from gpuwatch.errors import InvalidValueError
from gpuwatch.units import MAX_DURATION_S, format_duration, parse_duration, parse_whole_number

F = TypeVar("F", bound=Callable[..., Any])
"""A function a decorator adds click options to."""


class Parsed(AnyParamType):
    """A value read by `parse`, which raises `InvalidValueError` saying what is wrong with it.

    A value that is not text (a default given as the value itself) is taken as it is.
    """

    def __init__(self, parse: Callable[[str], Any], name: str = "text") -> None:
        self.parse = parse
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except InvalidValueError as error:
            self.fail(str(error), param, ctx)


class Duration(Parsed):
    """A duration such as 500ms, 2s, 10m or 24h, within a range; a plain number is seconds."""

    def __init__(self, *, minimum_s: float = 0.0, maximum_s: float = MAX_DURATION_S) -> None:
        super().__init__(partial(_duration, least_s=minimum_s, most_s=maximum_s), "duration")


class WholeNumber(Parsed):
    """A whole number within a range, in ASCII digits (click's INT takes `'٣'` and `'1_0'`)."""

    def __init__(self, low: int, high: int) -> None:
        super().__init__(partial(parse_whole_number, low=low, high=high), "number")


def _duration(text: str, *, least_s: float, most_s: float) -> float:
    seconds = parse_duration(text, most_s=most_s)
    if seconds < least_s:
        raise InvalidValueError(f"{text!r} is too short: the least is {format_duration(least_s)}")
    return seconds


def host_name(text: str) -> str:
    """A host for ssh, `HOST` or `USER@HOST`: not empty, and not read by ssh as an option."""
    if not text.strip() or text.startswith("-"):
        raise InvalidValueError(f"{text!r} is not a host name: give HOST or USER@HOST")
    return text


HOST = Parsed(host_name, "host")


def backend_options(command: F) -> F:
    """`--backend` and `--sim`, which say where the GPUs are read from."""
    command = click.option(
        "--sim",
        metavar="N|FILE",
        help="Simulate N GPUs, or the node a scenario file describes "
        "(docs/reference/scenario.md).  [default: $GPUWATCH_SIM]",
    )(command)
    return click.option(
        "--backend",
        type=click.Choice(BACKEND_KINDS),
        help="Where GPUs are read: auto (the daemon if it runs, else the NVIDIA driver), "
        "daemon, nvml, or sim.  [default: $GPUWATCH_BACKEND or auto]",
    )(command)


def no_jobs_option(shown: str) -> Callable[[F], F]:
    """`--no-jobs`, for a command that shows which job holds each GPU `shown` so."""
    return click.option(
        "--no-jobs",
        is_flag=True,
        help=f"Do not ask the daemon or Slurm which job holds each GPU ({shown}).",
    )


class HelpFormatter(click.HelpFormatter):
    """click's help, with examples kept as written and narrowed by their comments."""

    def write_text(self, text: str) -> None:
        self.buffer.extend(
            line + "\n"
            for line in paragraphs(text.split("\n\n"), self.width, indent=self.current_indent)
        )

    def write_dl(
        self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        lines = definition_list(list(rows), self.width, indent=self.current_indent)
        self.buffer.extend(fit_line(line, self.width) + "\n" for line in lines)


HELP_OPTION_NAMES = ["-h", "--help"]


class HelpContext(click.Context):
    formatter_class = HelpFormatter


class Command(click.Command):
    """A gpuwatch command: help drawn as every other command's, asked for by `-h` too."""

    context_class = HelpContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The command's own setting, not only the group's: click makes a command's help
        # option once, with the names of the first context it is made in, and keeps it. A
        # context made without the group (a test parsing a command's arguments) must not
        # leave `-h` out for every later run of the command.
        settings = dict(kwargs.get("context_settings") or {})
        settings.setdefault("help_option_names", HELP_OPTION_NAMES)
        kwargs["context_settings"] = settings
        super().__init__(*args, **kwargs)
