"""`gpuwatch tui`: builds the sources and hands them to the live screen."""

from __future__ import annotations

import click

from gpuwatch.backends import open_backend
from gpuwatch.cli.group import short_help
from gpuwatch.cli.options import HOST, Command, Duration, backend_options, no_jobs_option
from gpuwatch.leases.directory import LeaseDir
from gpuwatch.reports.training import reports_for_this_machine
from gpuwatch.sampling.node_jobs import jobs_reader
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.sources import LocalSource, RemoteSource, Source
from gpuwatch.tui.node.widgets import TrainingPanel


@click.command(cls=Command, short_help=short_help("tui"))
@backend_options
@click.option(
    "--interval",
    "interval_s",
    type=Duration(minimum_s=0.1, maximum_s=3600.0),
    default="1s",
    show_default=True,
    metavar="SECONDS",
    help="Sample every SECONDS (e.g. 1, 500ms; 100ms to 1h).",
)
@click.option(
    "--host",
    "hosts",
    type=HOST,
    multiple=True,
    metavar="[USER@]HOST",
    help="Show another machine, read over ssh (repeat for several; gpuwatch must be "
    "installed there); --backend and --sim apply on those machines.",
)
@click.option("--readonly", is_flag=True, help="Never signal processes: the keys are off.")
@click.option(
    "--idle-after",
    "idle_after_s",
    type=Duration(minimum_s=0, maximum_s=7 * 86400.0),
    default="10m",
    show_default=True,
    metavar="DURATION",
    help="Mark a process as an idle holder when it holds memory on a GPU idle this long "
    "(up to 7d).",
)
@no_jobs_option("on a Slurm node: a JOB column, and the job on each GPU card")
def tui(
    backend: str | None,
    sim: str | None,
    interval_s: float,
    hosts: tuple[str, ...],
    readonly: bool,
    idle_after_s: float,
    no_jobs: bool,
) -> int:
    """The live screen: every GPU, its processes, leases, waiting jobs and recent history.

    \b
    Examples:
      gpuwatch tui                      # this machine
      gpuwatch tui --sim 8              # a simulated 8-GPU node
      gpuwatch tui --host node7 --host alice@node8 --readonly
    """
    sources: list[Source]
    if hosts:
        sources = [RemoteSource(host, backend=backend, sim=sim) for host in hosts]
    else:
        opened = open_backend(backend, sim)
        jobs = jobs_reader(opened, one_shot=False, wanted=not no_jobs)
        sources = [
            LocalSource(
                opened,
                LeaseDir.read_only(simulation=opened.simulation),
                training=reports_for_this_machine,
                jobs=jobs,
            )
        ]
    panels = [] if hosts else [TrainingPanel()]  # training reports are this machine's own
    app = GpuwatchApp(
        sources,
        interval_s=interval_s,
        readonly=readonly,
        idle_after_s=idle_after_s,
        panels=panels,
    )
    try:
        app.run()
        return app.return_code or 0  # 1 when the app stopped on an error it showed
    finally:
        for source in sources:
            source.close()
