"""`gpuwatch pick`: choose GPUs, lease them, and run a command on them.

pick's own options end at the first argument that is not one of them, or at `--`: what
follows is the command, its options its own (click's `allow_interspersed_args=False`).
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from gpuwatch.backends import open_backend
from gpuwatch.choices import Format, check_one_mig_device, exclude_entries
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import Command, Duration, Parsed, backend_options
from gpuwatch.cli.terminal import terminal_columns, wrap
from gpuwatch.cli.wish_options import wish_options
from gpuwatch.errors import InvalidValueError
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import Device, MigDevice
from gpuwatch.placement.acquire import acquire, passed_down, simulated_daemon_note
from gpuwatch.placement.launch import exec_command
from gpuwatch.placement.rules import Choice
from gpuwatch.placement.visible import VARIABLE, child_environment
from gpuwatch.placement.wanted import wanted as wanted_from
from gpuwatch.request import Request, describe_wish
from gpuwatch.units import format_span


def _exclude(text: str) -> str:
    exclude_entries(text)  # checked now, to name the option in the error
    return text


@click.command(
    cls=Command,
    short_help=short_help("pick"),
    context_settings={"allow_interspersed_args": False},
)
@wish_options
@click.option(
    "--exclude",
    metavar="GPUS",
    multiple=True,
    type=Parsed(_exclude, "gpus"),
    help="Never these GPUs: nvidia-smi indices or UUIDs, comma-separated.",
)
@click.option(
    "--wait", is_flag=True, help="Wait in line until enough GPUs qualify, instead of failing."
)
@click.option(
    "--timeout",
    type=Duration(),
    metavar="DURATION",
    help="With --wait, give up after DURATION (30s, 10m, 2h); implies --wait.",
)
@click.option(
    "--format",
    "format_",
    type=click.Choice([f.value for f in Format]),
    default=Format.UUID.value,
    show_default=True,
    help="How to write CUDA_VISIBLE_DEVICES.",
)
@backend_options
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Give the chosen GPUs' UUIDs too, and say on stderr why the daemon was not used "
    "and how many malformed lease files were skipped.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] [COMMAND [ARGS...]]")
def pick(
    command: tuple[str, ...],
    wait: bool,
    timeout: float | None,
    format_: str,
    backend: str | None,
    sim: str | None,
    verbose: bool,
    exclude: tuple[str, ...],
    asked: Request,
) -> int:
    """Choose GPUs nobody uses, lease them to COMMAND and run it with CUDA_VISIBLE_DEVICES
    set to them. The lease lasts as long as COMMAND runs (however it ends), so jobs
    started alongside are given other GPUs. Without COMMAND, print the choice. Either way,
    one line on stderr says which GPUs were chosen, by nvidia-smi index.

    Examples:
      gpuwatch pick -- python train.py       # the idle GPU with most free memory
      gpuwatch pick -n 2 -- torchrun --nproc-per-node 2 x.py
      gpuwatch pick --min-free 20GiB --timeout 2h -- ./job
      gpuwatch pick --mem 10GiB -- python eval.py   # share a GPU
      export CUDA_VISIBLE_DEVICES=$(gpuwatch pick -n 2)   # no lease
      gpuwatch pick --mig 1g.10gb -- python infer.py   # a MIG device

    A GPU is in use, and left out, when another job's compute process runs on it, a
    graphics process there uses over 256MiB, over 1GiB of its memory is used
    (--max-used), or it is over 5% busy now or, with the daemon running, in the last
    minute (--max-util). --mem shares GPUs in use while its memory fits;
    --allow-busy takes them as free, chosen by free memory only.

    CUDA_VISIBLE_DEVICES gets the GPUs' UUIDs, which mean the same GPUs whatever
    CUDA_DEVICE_ORDER says; --format index writes nvidia-smi indices and sets
    CUDA_DEVICE_ORDER=PCI_BUS_ID beside them, for tools that read the variable as
    integers (some vLLM, DeepSpeed and dask code). An existing CUDA_VISIBLE_DEVICES
    (Slurm, Kubernetes, yours) is the set to choose from; it is never widened.
    Inside a Slurm job or step, only the GPUs Slurm gave it (SLURM_STEP_GPUS, found
    through gres.conf) are chosen from, whatever Slurm's CUDA_VISIBLE_DEVICES names;
    GPUWATCH_IGNORE_SLURM=1 turns that off.
    A GPU in MIG mode is only given out as MIG devices, with --mig, one per COMMAND
    (CUDA shows a process one MIG device); one of MIG- UUIDs only implies --mig any.

    Exit status: COMMAND's own once it runs; 2 bad usage, a request no GPU here
    could ever meet (--wait or not), or a Slurm step's GPUs gres.conf cannot tell;
    3 no NVIDIA driver or GPU, 4 not enough GPUs qualify, 5 timed out waiting, 126
    COMMAND not executable, 127 COMMAND not found.
    """
    if command and not command[0]:
        raise InvalidValueError("COMMAND is empty: give the program to run after --")
    if any("\0" in arg for arg in command):
        raise InvalidValueError("COMMAND holds a NUL character, which no program can be given")
    excluded = exclude_entries(exclude)
    wanted = wanted_from(asked, excluded, environ=os.environ, by_pick=True)
    if wanted.wants_mig and command:
        check_one_mig_device(asked.count, "COMMAND")
    fmt = Format(format_)
    waiting = wait or timeout is not None
    say = _say if verbose else None
    with open_backend(backend, sim, on_fallback=say) as opened:
        if (note := simulated_daemon_note(opened)) is not None:
            _say(note)
        lease_dir = LeaseDir.for_job(say=_say, simulation=opened.simulation)
        if say is not None and (skipped := lease_dir.read().skipped):
            say(f"skipped {skipped} malformed file(s) in the lease directory {lease_dir.path}")
        chosen, leases = acquire(
            opened,
            wanted,
            lease_dir=lease_dir,
            command=shlex.join(command) or "(print only)",
            hold=bool(command),
            wait=waiting,
            timeout_s=timeout,
            on_wait=_WaitDisplay() if waiting else None,
            on_note=_say,
        )
    env = passed_down(leases, child_environment(chosen, fmt, os.environ))
    _say(_chose(chosen, verbose=verbose))
    if not command:
        index_format = fmt is Format.INDEX and not wanted.wants_mig
        _print_choice(env[VARIABLE], chosen, index_format=index_format)
        return 0
    for lease in leases:
        lease.pass_to_child()
    exec_command(command, env)


def _print_choice(visible: str, chosen: tuple[Device, ...], *, index_format: bool) -> None:
    """Prints what CUDA_VISIBLE_DEVICES would be, and warns that no lease holds it."""
    print(visible)
    note = "; also export CUDA_DEVICE_ORDER=PCI_BUS_ID" if index_format else ""
    sys.stderr.write(
        f"gpuwatch: no lease is held, so another job may take {_these(chosen)}; "
        f"run your command as gpuwatch pick [...] -- COMMAND to hold a lease{note}\n"
    )


def _these(chosen: tuple[Device, ...]) -> str:
    """`this GPU`, `these 2 GPUs`, `this MIG device`: what a print-only pick chose."""
    noun = "MIG device" if isinstance(chosen[0], MigDevice) else "GPU"
    return f"this {noun}" if len(chosen) == 1 else f"these {len(chosen)} {noun}s"


def _chose(chosen: tuple[Device, ...], *, verbose: bool) -> str:
    """`chose GPUs 3, 2`: what the job got, best first, by nvidia-smi index (and UUID with
    `verbose`), so that a job's log says which GPUs it ran on."""
    if verbose:
        return "chose " + ", ".join(_described(device) for device in chosen)
    if isinstance(chosen[0], MigDevice):
        return "chose " + ", ".join(_described(device, uuid=False) for device in chosen)
    noun = "GPU" if len(chosen) == 1 else "GPUs"
    return f"chose {noun} " + ", ".join(str(device.index) for device in chosen)


def _described(device: Device, *, uuid: bool = True) -> str:
    if isinstance(device, MigDevice):
        text = f"MIG device {device.label} {device.profile or ''}".rstrip()
        return f"{text} ({device.uuid})" if uuid else text
    return f"GPU {device.index} ({device.uuid})"


def _say(message: str) -> None:
    sys.stderr.write(f"gpuwatch: {message}\n")


SAY_WAITED_AFTER_S = 10.0
"""How long a pick waits before the time it has waited is worth a word."""


class _WaitDisplay:
    """What a waiting pick says: a live block on a terminal, a single note otherwise; the
    time waited only once it is `SAY_WAITED_AFTER_S` or more. On a terminal the first line
    is wrapped, never cut: what is waited for may be longer than the terminal is wide."""

    def __init__(self) -> None:
        self._terminal = sys.stderr.isatty()
        self._drawn = 0

    def __call__(self, request: Request, choice: Choice, waited_s: float) -> None:
        if not self._terminal and self._drawn:
            return
        qualify = "qualifies" if choice.qualifying == 1 else "qualify"
        waited = f" ({format_span(waited_s)} so far)" if waited_s >= SAY_WAITED_AFTER_S else ""
        lead = (
            f"gpuwatch: waiting for {describe_wish(request)}{waited}, "
            f"{choice.qualifying} {qualify} now"
        )
        reasons = [f"  {reason}" for reason in choice.reasons]
        if self._terminal:
            width = terminal_columns() - 1
            # One row per line, or the block is not redrawn in place: cut what is still wider.
            lines = [line[:width] for line in (*_wrapped(lead, _GIVE_UP, width), *reasons)]
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            text = up + "".join(f"\x1b[2K{line}\n" for line in lines) + "\x1b[J"
        else:
            lines = [f"{lead} {_GIVE_UP}", *reasons]
            text = "\n".join(lines) + "\n"
        sys.stderr.write(text)
        sys.stderr.flush()
        self._drawn = len(lines)


_GIVE_UP = "(Ctrl-C to give up)"


def _wrapped(text: str, tail: str, width: int) -> list[str]:
    """`text` wrapped to `width`, and `tail` after it, kept whole."""
    lines = wrap(text, width) or [""]
    if len(lines[-1]) + 1 + len(tail) <= width:
        return [*lines[:-1], f"{lines[-1]} {tail}"]
    return [*lines, tail]
