"""The `gpuwatch` click group. Commands are imported only when run, to keep start-up fast."""

from __future__ import annotations

import importlib

import click

from gpuwatch._version import __version__

# name -> "module:function"; the order is the order of `gpuwatch --help`.
_COMMANDS = {
    "status": "gpuwatch.cli.status:status",
}


class _LazyGroup(click.Group):
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


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="gpuwatch")
def cli() -> None:
    """Watch the GPUs of a shared machine, and pick free ones for your jobs.

    \b
    Without a GPU, add --sim 4 to any command to try it on a simulated node.
    Exit codes: 0 ok, 1 failed, 2 bad usage, 3 no NVIDIA driver or no GPU,
    130 interrupted.
    """
