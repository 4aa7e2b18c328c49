"""The `gpuwatch` click group: each command's module is imported when that command runs.

This is click's own pattern for lazily loaded subcommands. Importing every command's
module at start (the TUI with textual, the daemon with prometheus-client, the fleet's
clients, the reports) made a one-shot `gpuwatch status --json` take 3.7 times the CPU
time it takes this way, and `gpuwatch pick -n 1 -- true` 3.3 times (8 simulated GPUs;
medians of 20 runs of each, interleaved, on a loaded 2-core machine)."""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpuwatch._version import __version__
from gpuwatch.cli.options import HELP_OPTION_NAMES, HelpContext

COMMANDS = {
    "status": (
        "gpuwatch.cli.status:status",
        "Show every GPU with its memory, load, temperature, power, processes and leases.",
    ),
    "pick": ("gpuwatch.cli.pick:pick", "Choose free GPUs and run a command on them."),
    "where": (
        "gpuwatch.cli.where_command:where_command",
        "Which nodes of the fleet could run a job now.",
    ),
    "tui": (
        "gpuwatch.cli.tui_command:tui",
        "The live screen: every GPU, its processes, leases, waiting jobs and recent history.",
    ),
    "fleet": (
        "gpuwatch.cli.fleet_command:fleet",
        "Every node's GPUs on one screen: free GPUs, memory, load, leases and jobs.",
    ),
    "daemon": (
        "gpuwatch.cli.daemon_command:daemon",
        "Sample the GPUs for every local client, keep history, serve Prometheus.",
    ),
    "torch-report": (
        "gpuwatch.cli.torch_report:torch_report",
        "Show an OOM report or summarise a memory snapshot.",
    ),
    "job-report": (
        "gpuwatch.cli.job_report:job_report",
        "A Slurm job's use of its GPUs, from the daemon.",
    ),
}
"""Every command: its name, where it is defined (`module:name`), and its one line of help,
in the order `gpuwatch --help` lists them. The line is the command's own `short_help`
(`short_help(NAME)`), so that the list is written without importing any command."""


def short_help(name: str) -> str:
    """The one line `gpuwatch --help` says of command `name`."""
    return COMMANDS[name][1]


class LazyGroup(click.Group):
    """A group whose commands are imported by name when asked for."""

    context_class = HelpContext

    def __init__(
        self, *args: Any, lazy_subcommands: dict[str, tuple[str, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.lazy_subcommands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one line each, as click lists them, from the registry
        (click's own would import every command for its line)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        # a stand-in of each command, made only to cut its line as click cuts it
        stand_ins = [
            click.Command(name, short_help=self.lazy_subcommands[name][1]) for name in names
        ]
        rows = [
            (name, command.get_short_help_str(limit))
            for name, command in zip(names, stand_ins, strict=True)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name, ("", ""))[0]
        if not target:
            return None
        module, name = target.split(":")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(
    cls=LazyGroup,
    lazy_subcommands=COMMANDS,
    context_settings={"help_option_names": HELP_OPTION_NAMES},
)
@click.version_option(__version__, "-V", "--version", prog_name="gpuwatch")
def cli() -> None:
    """Watch the GPUs of a shared machine, and pick free ones for your jobs.

    Without a GPU, add --sim 4 to any command to try it on a simulated node.

    Exit codes: 0 ok, 1 failed, 2 bad usage, 3 no NVIDIA driver or no GPU,
    4 not enough free GPUs, 5 timed out waiting, 6 remote host or fleet unreachable,
    7 job never seen (job-report), 8 history shorter than the job (job-report),
    126/127 command not executable / not found, 130 interrupted.
    """


def command(name: str) -> click.Command:
    """The command `gpuwatch NAME` runs."""
    found = cli.get_command(click.Context(cli), name)
    if found is None:
        raise KeyError(name)
    return found
