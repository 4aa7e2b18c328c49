"""The `gpuwatch` click group. Commands are imported only when run, to keep start-up fast."""

from __future__ import annotations

import importlib

import click

from gpuwatch._version import __version__
from gpuwatch.cli.options import HELP_OPTION_NAMES, HelpContext

# name -> "module:function"; the order is the order of `gpuwatch --help`.
_COMMANDS = {
    "status": "gpuwatch.cli.status_command:status",
    "pick": "gpuwatch.cli.group:pick",
    "where": "gpuwatch.cli.group:where",
    "tui": "gpuwatch.cli.tui_command:tui",
    "fleet": "gpuwatch.cli.fleet_command:fleet",
    "daemon": "gpuwatch.cli.daemon_command:daemon",
    "torch-report": "gpuwatch.cli.torch_report:torch_report",
    "job-report": "gpuwatch.cli.job_report:job_report",
}


class _LazyGroup(click.Group):
    context_class = HelpContext

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target.split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": HELP_OPTION_NAMES})
@click.version_option(__version__, "-V", "--version", prog_name="gpuwatch")
def cli() -> None:
    """Watch the GPUs of a shared machine, and pick free ones for your jobs.

    Without a GPU, add --sim 4 to any command to try it on a simulated node.

    Exit codes: 0 ok, 1 failed, 2 bad usage, 3 no NVIDIA driver or no GPU,
    4 not enough free GPUs, 5 timed out waiting, 6 remote host or fleet unreachable,
    7 job never seen (job-report), 8 history shorter than the job (job-report),
    126/127 command not executable / not found, 130 interrupted.
    """


@click.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="Choose free GPUs and run a command on them.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def pick(args: tuple[str, ...]) -> int:
    """Choose free GPUs and run a command on them (see gpuwatch pick --help)."""
    # `gpuwatch pick` is normally dispatched before click is imported (gpuwatch.cli.main);
    # this entry lists it in `gpuwatch --help` and serves callers that go through click.
    from gpuwatch.cli.pick import run_pick

    return run_pick(list(args))


@click.command(
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="Which nodes of the fleet could run a job now.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def where(args: tuple[str, ...]) -> int:
    """Which nodes of the fleet could run a job now (see gpuwatch where --help)."""
    # Dispatched before click is imported, as pick is; listed here for `gpuwatch --help`.
    from gpuwatch.cli.where_command import run_where

    return run_where(list(args))
