"""`gpuwatch pick`: choose GPUs, lease them, and run a command on them.

pick stands in front of every job it starts, so its start-up time is paid
again and again: its options are read by `gpuwatch.cli.argv`, not by click or
argparse, and it loads only what its path needs (bench/pick_startup.py
measures it).
"""

from __future__ import annotations

import os
import shlex
import sys

from gpuwatch.backends import BACKEND_KINDS, open_backend
from gpuwatch.choices import (
    WISHES,
    Format,
    check_one_mig_device,
    exclude_entries,
)
from gpuwatch.cli.argv import HELP, Option, parse
from gpuwatch.cli.wish_options import WISH_OPTIONS
from gpuwatch.errors import InvalidValueError
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.models import Device, MigDevice
from gpuwatch.placement.acquire import Wanted, acquire, passed_down
from gpuwatch.placement.launch import exec_command
from gpuwatch.placement.rules import Choice
from gpuwatch.placement.visible import VARIABLE, child_environment
from gpuwatch.request import Request, describe_wish
from gpuwatch.units import parse_duration

_DESCRIPTION = """\
Choose GPUs nobody uses, lease them to COMMAND and run it with CUDA_VISIBLE_DEVICES
set to them. The lease lasts as long as COMMAND runs (however it ends), so jobs
started alongside are given other GPUs. Without COMMAND, print the choice.

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
CUDA_DEVICE_ORDER=PCI_BUS_ID beside them. An existing CUDA_VISIBLE_DEVICES
(Slurm, Kubernetes, yours) is the set to choose from; it is never widened.
Inside a Slurm job or step, only the GPUs Slurm gave it (SLURM_STEP_GPUS, found
through gres.conf) are chosen from, whatever Slurm's CUDA_VISIBLE_DEVICES names;
GPUWATCH_IGNORE_SLURM=1 turns that off.
A GPU in MIG mode is only given out as MIG devices, with --mig, one per COMMAND
(CUDA shows a process one MIG device); one of MIG- UUIDs only implies --mig any.

Exit status: COMMAND's own once it runs; 2 bad usage (or a Slurm step's GPUs
gres.conf cannot tell), 3 no NVIDIA driver or
GPU, 4 not enough GPUs qualify, 5 timed out waiting, 126 COMMAND not
executable, 127 COMMAND not found."""
_USAGE = "gpuwatch pick [OPTIONS] [--] [COMMAND [ARGS...]]"


def _exclude(text: str) -> str:
    exclude_entries(text)  # checked now, to name the option in the error
    return text


OPTIONS = (
    *WISH_OPTIONS[:-1],
    Option(
        "--exclude",
        metavar="GPUS",
        repeat=True,
        convert=_exclude,
        help="Never these GPUs: nvidia-smi indices or UUIDs, comma-separated.",
    ),
    WISH_OPTIONS[-1],
    Option("--wait", help="Wait in line until enough GPUs qualify, instead of failing."),
    Option(
        "--timeout",
        metavar="DURATION",
        convert=parse_duration,
        help="With --wait, give up after DURATION (30s, 10m, 2h); implies --wait.",
    ),
    Option(
        "--format",
        choices=[f.value for f in Format],
        default=Format.UUID.value,
        help="How to write CUDA_VISIBLE_DEVICES.",
    ),
    Option(
        "--backend",
        choices=BACKEND_KINDS,
        help="Where GPUs are read: auto (the daemon if it runs, else the NVIDIA driver), "
        "daemon, nvml, or sim.  [default: $GPUWATCH_BACKEND or auto]",
    ),
    Option(
        "--sim",
        metavar="N|FILE",
        help="Simulate N GPUs, or the node a scenario file describes "
        "(docs/reference/scenario.md).  "
        "[default: $GPUWATCH_SIM]",
    ),
    Option(
        "-v",
        "--verbose",
        help="Say on stderr which GPUs were chosen, why the daemon was not used, and how many "
        "malformed lease files were skipped.",
    ),
)


def pick_help() -> str:
    """`gpuwatch pick --help`, drawn as the click commands draw theirs (gpuwatch.cli.terminal)."""
    from gpuwatch.cli.terminal import definition_list, help_width, paragraphs

    width = help_width()
    lines = [f"Usage: {_USAGE}", ""]
    lines += paragraphs(_DESCRIPTION.split("\n\n"), width)
    lines += ["", "Options:"]
    lines += definition_list([option.help_row() for option in (*OPTIONS, HELP)], width)
    return "\n".join(lines) + "\n"


def run_pick(args: list[str]) -> int:
    """`gpuwatch pick ARGS`: execs the command, or prints the choice and returns 0."""
    options, command = parse(OPTIONS, args, command="gpuwatch pick")
    if options["help"]:
        sys.stdout.write(pick_help())
        return 0
    if command and not command[0]:
        raise InvalidValueError("COMMAND is empty: give the program to run after --")
    if any("\0" in arg for arg in command):
        raise InvalidValueError("COMMAND holds a NUL character, which no program can be given")
    wishes = {name: options[option.lstrip("-").replace("-", "_")] for name, _, option in WISHES}
    wanted = Wanted.from_wishes(wishes, by_pick=True)
    if wanted.wants_mig and command:
        check_one_mig_device(options["gpus"], "COMMAND")
    fmt = Format(options["format"])
    waiting = options["wait"] or options["timeout"] is not None
    say = _say if options["verbose"] else None
    lease_dir = LeaseDir.for_job(say=_say)
    if say is not None and (skipped := lease_dir.read().skipped):
        say(f"skipped {skipped} malformed file(s) in the lease directory {lease_dir.path}")
    with open_backend(options["backend"], options["sim"], on_fallback=say) as backend:
        chosen, leases = acquire(
            backend,
            wanted,
            lease_dir=lease_dir,
            command=shlex.join(command) or "(print only)",
            hold=bool(command),
            wait=waiting,
            timeout_s=options["timeout"],
            on_wait=_WaitDisplay() if waiting else None,
            on_note=_say,
        )
    env = passed_down(leases, child_environment(chosen, fmt, os.environ))
    if options["verbose"] or not command:
        _say("chose " + ", ".join(_described(device) for device in chosen))
    if not command:
        print(env[VARIABLE])
        index_format = fmt is Format.INDEX and not wanted.wants_mig
        note = "; also export CUDA_DEVICE_ORDER=PCI_BUS_ID" if index_format else ""
        sys.stderr.write(
            f"gpuwatch: no lease is held, so another job may take {_these(chosen)}; "
            f"run your command as gpuwatch pick [...] -- COMMAND to hold a lease{note}\n"
        )
        return 0
    for lease in leases:
        lease.pass_to_child()
    exec_command(command, env)


def _these(chosen: tuple[Device, ...]) -> str:
    """`this GPU`, `these 2 GPUs`, `this MIG device`: what a print-only pick chose."""
    noun = "MIG device" if isinstance(chosen[0], MigDevice) else "GPU"
    return f"this {noun}" if len(chosen) == 1 else f"these {len(chosen)} {noun}s"


def _described(device: Device) -> str:
    if isinstance(device, MigDevice):
        return f"MIG device {device.label} {device.profile or ''} ({device.uuid})"
    return f"GPU {device.index} ({device.uuid})"


def _say(message: str) -> None:
    sys.stderr.write(f"gpuwatch: {message}\n")


class _WaitDisplay:
    """What a waiting pick says: a live block on a terminal, a single note otherwise."""

    def __init__(self) -> None:
        self._terminal = sys.stderr.isatty()
        self._drawn = 0

    def __call__(self, request: Request, choice: Choice, waited_s: float) -> None:
        if not self._terminal and self._drawn:
            return
        from gpuwatch.cli.terminal import printable, terminal_columns

        width = terminal_columns() - 1
        qualify = "qualifies" if choice.qualifying == 1 else "qualify"
        lines = [
            f"gpuwatch: waiting {waited_s:.0f}s for {describe_wish(request)}, "
            f"{choice.qualifying} {qualify} now (Ctrl-C to give up)",
            *(f"  {printable(reason)}" for reason in choice.reasons),
        ]
        if self._terminal:
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            text = up + "".join(f"\x1b[2K{line[:width]}\n" for line in lines) + "\x1b[J"
        else:
            text = "\n".join(lines) + "\n"
        sys.stderr.write(text)
        sys.stderr.flush()
        self._drawn = len(lines)
