"""Options, value types and the help layout shared by the click commands."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from gpuwatch.backends import BACKEND_KINDS
from gpuwatch.cli._compat import FloatParamType, IntParamType, StrParamType
from gpuwatch.cli.terminal import definition_list, fit_line, paragraphs
from gpuwatch.errors import InvalidValueError
from gpuwatch.units import MAX_DURATION_S, format_duration, parse_duration, parse_whole_number

F = TypeVar("F", bound=Callable[..., Any])


class Duration(FloatParamType):
    """A duration such as 500ms, 2s, 10m or 24h; a plain number is seconds."""

    name = "duration"

    def __init__(self, *, minimum_s: float = 0.0, maximum_s: float = MAX_DURATION_S) -> None:
        self.minimum_s = minimum_s
        self.maximum_s = maximum_s

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(str(value), most_s=self.maximum_s)
        except InvalidValueError as error:
            self.fail(str(error), param, ctx)
        if seconds < self.minimum_s:
            least = format_duration(self.minimum_s)
            self.fail(f"{value!r} is too short: the least is {least}", param, ctx)
        return seconds


class WholeNumber(IntParamType):
    """A whole number within a range, in ASCII digits (click's INT takes `'٣'` and `'1_0'`)."""

    name = "number"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_whole_number(str(value), low=self.low, high=self.high)
        except InvalidValueError as error:
            self.fail(str(error), param, ctx)


class HostName(StrParamType):
    """A host for ssh, `HOST` or `USER@HOST`: not empty, and not read by ssh as an option."""

    name = "host"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        host = str(value)
        if not host.strip() or host.startswith("-"):
            self.fail(f"{host!r} is not a host name: give HOST or USER@HOST", param, ctx)
        return host


def backend_options(command: F) -> F:
    """`--backend` and `--sim`, which say where the GPUs are read from."""
    command = click.option(
        "--sim",
        metavar="N|FILE",
        help="Simulate N GPUs, or the node a scenario file describes "
        "(docs/reference/scenario.md).  "
        "[default: $GPUWATCH_SIM]",
    )(command)
    return click.option(
        "--backend",
        type=click.Choice(BACKEND_KINDS),
        help="Where GPUs are read: auto (the daemon if it runs, else the NVIDIA driver), "
        "daemon, nvml, or sim.  [default: $GPUWATCH_BACKEND or auto]",
    )(command)


class HelpFormatter(click.HelpFormatter):
    """click's help, laid out by the same functions as `gpuwatch pick --help`."""

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
