"""The options that state a job's wishes, as `gpuwatch pick` and `gpuwatch where` take them.

One decorator, so that the two commands take, check and explain each wish alike, and are
handed the one `Request` they state (`asked`): each option read by its own parser, the
request built here, field by field (`choices.WISHES` names each option's field for
messages).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuwatch.choices import Strategy, check_gpu_count, check_mig, check_percent
from gpuwatch.cli.options import Parsed
from gpuwatch.errors import InvalidValueError
from gpuwatch.request import Request
from gpuwatch.units import parse_number, parse_size, parse_whole_number

R = TypeVar("R")

MAX_GPU_COUNT = 1024


def _size(text: str) -> int:
    return parse_size(text, unit_required=True)


def _declared_size(text: str) -> int:
    size = _size(text)
    if size == 0:  # a share of nothing would fit on any GPU, however full
        raise InvalidValueError(f"{text!r} declares no memory: give what the job will use")
    return size


def _gpu_count(text: str) -> int:
    if text.strip().startswith("-") and text.strip()[1:].isdigit():
        raise InvalidValueError(f"{text.strip()!r}: ask for at least 1 GPU")
    return check_gpu_count(parse_whole_number(text, low=1, high=MAX_GPU_COUNT))


def _percent(text: str) -> float:
    return check_percent(parse_number(text.strip().removesuffix("%"), low=0, high=100))


SIZE = Parsed(_size, "size")


def wish_options(command: Callable[..., R]) -> Callable[..., R]:
    """Decorates a command with the options of a job's wishes (all but `--exclude`, which
    names GPUs of one machine: pick's own); the command is given them as one `asked`."""

    @functools.wraps(command)
    def stated(
        *args: Any,
        gpus: int,
        min_free: int | None,
        max_util: float | None,
        max_used: int | None,
        allow_busy: bool,
        allow_unknown_holders: bool,
        mem: int | None,
        strategy: str,
        mig: str | None,
        **others: Any,
    ) -> R:
        asked = Request(
            count=gpus,
            min_free_bytes=min_free,
            max_util_pct=max_util,
            mem_bytes=mem,
            strategy=Strategy(strategy),
            mig=mig,
            max_used_bytes=max_used,
            allow_busy=allow_busy,
            allow_unknown_holders=allow_unknown_holders,
        )
        return command(*args, asked=asked, **others)

    options = (
        click.option(
            "-n",
            "--gpus",
            metavar="N",
            type=Parsed(_gpu_count, "count"),
            default=1,
            show_default=True,
            help=f"How many GPUs (1 to {MAX_GPU_COUNT}).",
        ),
        click.option(
            "--min-free",
            metavar="SIZE",
            type=SIZE,
            help="Only GPUs with at least SIZE free memory (8GiB, 500MB, ...; a unit is required).",
        ),
        click.option(
            "--max-util",
            metavar="PCT",
            type=Parsed(_percent, "percentage"),
            help="Only GPUs at most PCT% busy (0 to 100), now and, with the daemon running, "
            "over the last minute.  [default: 5 without --mem or --allow-busy]",
        ),
        click.option(
            "--max-used",
            metavar="SIZE",
            type=SIZE,
            help="Only GPUs with at most SIZE memory in use (beyond the driver's reserve).  "
            "[default: 1GiB without --mem or --allow-busy]",
        ),
        click.option(
            "--allow-busy",
            is_flag=True,
            help="Take GPUs other jobs use as if free, ranked by free memory alone; "
            "--max-util and --max-used still apply when given.",
        ),
        click.option(
            "--allow-unknown-holders",
            is_flag=True,
            help="Also take GPUs whose holders nobody can tell, where the node's scheduler "
            "(Slurm, the kubelet) is down, slow or answers what cannot be believed: a job of "
            "the cluster may hold them.  [default: never]",
        ),
        click.option(
            "--mem",
            metavar="SIZE",
            type=Parsed(_declared_size, "size"),
            help="Memory the job will use: share a GPU with others while all fit.  "
            "[default: the GPU is the job's alone]",
        ),
        click.option(
            "--strategy",
            type=click.Choice([s.value for s in Strategy]),
            default=Strategy.MOST_FREE.value,
            show_default=True,
            help="Ranking: most free memory, least busy, or the tightest fit (pack).",
        ),
        click.option(
            "--mig",
            metavar="PROFILE|any",
            type=Parsed(check_mig, "profile"),
            help="A MIG device of a MIG-enabled GPU instead of a whole GPU: of this profile "
            "(1g.10gb, 3g.40gb, ...) or any.",
        ),
    )
    decorated: Callable[..., R] = stated
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
