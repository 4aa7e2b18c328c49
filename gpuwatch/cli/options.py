"""Options and value types shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuwatch.backends import BACKEND_KINDS
from gpuwatch.cli._compat import FloatParamType
from gpuwatch.errors import InvalidValueError
from gpuwatch.units import parse_duration

F = TypeVar("F", bound=Callable[..., Any])


class Duration(FloatParamType):
    """A duration such as 500ms, 2s, 10m or 24h; a plain number is seconds."""

    name = "duration"

    def __init__(self, *, minimum_s: float = 0.0) -> None:
        self.minimum_s = minimum_s

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(str(value))
        except InvalidValueError as error:
            self.fail(str(error), param, ctx)
        if seconds < self.minimum_s:
            self.fail(f"{value!r} is too short: the least is {self.minimum_s:g}s", param, ctx)
        return seconds


def backend_options(command: F) -> F:
    """`--backend` and `--sim`, which say where the GPUs are read from."""
    command = click.option(
        "--sim",
        metavar="N|FILE",
        help="Simulate N GPUs, or the node a scenario file describes (see README). "
        "[default: $GPUWATCH_SIM]",
    )(command)
    return click.option(
        "--backend",
        type=click.Choice(BACKEND_KINDS),
        help="Where GPUs are read: auto (the NVIDIA driver), nvml, or sim. "
        "[default: $GPUWATCH_BACKEND or auto]",
    )(command)
