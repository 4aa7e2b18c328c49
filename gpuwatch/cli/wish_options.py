"""The options that state a job's wishes, as `gpuwatch pick` and `gpuwatch where` read them.

One table (in `gpuwatch.cli.argv`'s terms, which pick needs for its start-up time) so that
the two commands take, check and explain each wish alike; `choices.WISHES` says which
request field each one fills.
"""

from __future__ import annotations

from gpuwatch.choices import Strategy, check_gpu_count, check_mig, check_percent
from gpuwatch.cli.argv import Option
from gpuwatch.errors import InvalidValueError
from gpuwatch.units import parse_number, parse_size, parse_whole_number

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


WISH_OPTIONS = (
    Option(
        "-n",
        "--gpus",
        metavar="N",
        convert=_gpu_count,
        default=1,
        help=f"How many GPUs (1 to {MAX_GPU_COUNT}).",
    ),
    Option(
        "--min-free",
        metavar="SIZE",
        convert=_size,
        help="Only GPUs with at least SIZE free memory (8GiB, 500MB, ...; a unit is required).",
    ),
    Option(
        "--max-util",
        metavar="PCT",
        convert=_percent,
        help="Only GPUs at most PCT% busy (0 to 100), now and, with the daemon running, "
        "over the last minute.  [default: 5 without --mem or --allow-busy]",
    ),
    Option(
        "--max-used",
        metavar="SIZE",
        convert=_size,
        help="Only GPUs with at most SIZE memory in use (beyond the driver's reserve).  "
        "[default: 1GiB without --mem or --allow-busy]",
    ),
    Option(
        "--allow-busy",
        help="Take GPUs other jobs use as if free, ranked by free memory alone; "
        "--max-util and --max-used still apply when given.",
    ),
    Option(
        "--mem",
        metavar="SIZE",
        convert=_declared_size,
        help="Memory the job will use: share a GPU with others while all fit.  "
        "[default: the GPU is the job's alone]",
    ),
    Option(
        "--strategy",
        choices=[s.value for s in Strategy],
        default=Strategy.MOST_FREE.value,
        help="Ranking: most free memory, least busy, or the tightest fit (pack).",
    ),
    Option(
        "--mig",
        metavar="PROFILE|any",
        convert=check_mig,
        help="A MIG device of a MIG-enabled GPU instead of a whole GPU: of this profile "
        "(1g.10gb, 3g.40gb, ...) or any.",
    ),
)
