"""`gpuwatch tui` on a Slurm node: the JOB column, the job on each GPU card, allocated GPUs
left idle, and "jobs unknown" in the section's header. Levels 1 (pure) and 2 (a Pilot)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from msgspec.structs import replace
from textual.widgets import Static

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs.job_table import Job, JobTable, NodeJobs, Pod
from gpuwatch.sampling.allocated_idle import IDLE_WINDOW_S
from gpuwatch.sampling.node_jobs import JobsReader
from gpuwatch.tui.common import render
from gpuwatch.tui.common.frames import Frame
from gpuwatch.tui.common.section import Section
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.rows import RowFilter, build_rows, columns_for
from gpuwatch.tui.node.sources import LocalSource
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.tui import HOST, QuietSource, slurm_jobs


def slurm_frame(jobs: NodeJobs | None = None) -> Frame:
    """The simulated 4-GPU node (minor number = index) with `jobs`, by default `slurm_jobs`."""
    source = LocalSource(SimBackend(4, clock=lambda: FROZEN_TIME), None, host_stats=lambda: HOST)
    frame = source.read()
    assert frame.snapshot is not None
    if jobs is None:
        jobs = slurm_jobs([gpu.uuid for gpu in frame.snapshot.gpus])
    return replace(frame, jobs=jobs)


# --- level 1: pure ----------------------------------------------------------------------


def test_the_job_column_is_shown_only_where_a_scheduler_answers() -> None:
    # WHEN the columns for a wide screen are chosen, with and without a scheduler
    with_jobs = [c.key for c in columns_for(200, several_hosts=False, jobs=True)]
    without = [c.key for c in columns_for(200, several_hosts=False)]
    # THEN JOB follows GPU on a Slurm node, and is not there elsewhere
    assert with_jobs[with_jobs.index("gpu") + 1] == "job"
    assert "job" not in without


def test_each_process_row_names_the_job_holding_its_gpu() -> None:
    # GIVEN a frame of processes on GPUs 0-3, jobs holding GPUs 0-2
    frame = slurm_frame()
    # WHEN its rows are built
    rows = build_rows(frame, {}, FROZEN_TIME, 600.0)
    # THEN each row's job is its GPU's holder, empty on the free GPU
    expected = {0: "1234", 1: "1234", 2: "1240", 3: ""}
    assert rows and all(row.job == expected[row.gpu] for row in rows if row.gpu is not None)


def test_the_filter_finds_the_processes_of_a_job() -> None:
    # GIVEN the rows of a Slurm node
    rows = build_rows(slurm_frame(), {}, FROZEN_TIME, 600.0)
    # WHEN they are filtered by a job id
    kept = [row for row in rows if RowFilter.parse("1240").matches(row)]
    # THEN the rows of that job's GPU are kept
    assert kept and {row.gpu for row in kept} == {2}


def test_a_card_names_its_job_with_time_left_and_marks_it_allocated_idle() -> None:
    # GIVEN a section showing the Slurm node
    section = Section(0, "sim-node", 1.0)
    section.apply(slurm_frame(), 0.0)
    # WHEN each GPU's card is drawn
    titles = []
    for index in range(4):
        extra = section.card_input(index, 0.0, 100, 600.0)
        gpu = section.frame.snapshot.gpus[index]  # type: ignore[union-attr]
        titles.append("".join(text for text, _ in render.gpu_card(gpu, extra, 100, 0)[0]))
    # THEN the held ones name the job, its user and time left; GPU 1 is allocated and idle
    assert "job 1234 alice  2:13:05 left" in titles[0] and "idle" not in titles[0]
    assert "job 1234 alice  2:13:05 left  allocated, idle 20m" in titles[1]
    assert "job 1240 bob  no time limit" in titles[2]
    assert "job" not in titles[3]


def pod_frame(container: str) -> Frame:
    """The simulated node with GPU 0 held by Kubernetes pod ml/train-0 (`container` in it)."""
    frame = slurm_frame(NodeJobs())
    assert frame.snapshot is not None
    uuid = frame.snapshot.gpus[0].uuid or ""
    pod = Pod("ml", "train-0", container)
    job = Job("ml/train-0", None, container, (), None, None, device_uuids=(uuid,), pod=pod)
    return replace(frame, jobs=NodeJobs(JobTable((job,), FROZEN_TIME), scheduler=True))


@pytest.mark.parametrize(
    ("container", "title"),
    [
        ("trainer", "pod ml/train-0 (container trainer)"),
        ("", "pod ml/train-0"),
    ],
    ids=["container-known", "container-unknown"],
)
def test_a_card_names_a_kubernetes_pod_as_a_pod(container: str, title: str) -> None:
    # GIVEN a section showing a node whose GPU 0 a Kubernetes pod holds
    section = Section(0, "sim-node", 1.0)
    section.apply(pod_frame(container), 0.0)
    # WHEN GPU 0's card is drawn
    extra = section.card_input(0, 0.0, 100, 600.0)
    gpu = section.frame.snapshot.gpus[0]  # type: ignore[union-attr]
    drawn = "".join(text for text, _ in render.gpu_card(gpu, extra, 100, 0)[0])
    # THEN it names the pod (and its container where known), not a Slurm job
    assert title in drawn and "job " not in drawn and "?" not in drawn


# --- level 2: the app ---------------------------------------------------------------------


def run_app(frame: Frame, check: object, size: tuple[int, int] = (160, 40)) -> None:
    app = GpuwatchApp(
        [QuietSource("sim-node")], clock=lambda: FROZEN_TIME, sample=False, as_root=False
    )

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            app.feed(0, frame)
            await pilot.pause()
            check(app)  # type: ignore[operator]

    asyncio.run(main())


@pytest.mark.slow
def test_the_screen_shows_the_job_column_and_the_jobs_on_the_cards() -> None:
    def check(app: GpuwatchApp) -> None:
        # THEN the table has a JOB column naming each process's job ("-" on a free GPU)
        table = app.table()
        column = table.get_column_index("job")
        gpu_column = table.get_column_index("gpu")
        shown = {
            str(table.get_row_at(i)[gpu_column]).strip(): str(table.get_row_at(i)[column]).strip()
            for i in range(table.row_count)
        }
        expected = {"0": "1234", "1": "1234", "2": "1240", "3": "-"}
        assert {"0", "2"} <= set(shown) and shown == {gpu: expected[gpu] for gpu in shown}
        # AND the cards name the jobs, GPU 1 marked allocated and idle
        cards = str(app.query_one("#section-0", Static).render())
        assert "job 1234 alice  2:13:05 left" in cards
        assert "job 1234 alice  idle 20m" in cards and "job 1240 bob" in cards

    # GIVEN a Slurm node's frame, WHEN the screen shows it
    run_app(slurm_frame(), check)


@pytest.mark.slow
def test_jobs_unknown_is_said_in_the_header_and_the_gpus_are_shown() -> None:
    unknown = NodeJobs(None, "Slurm did not answer within 2s", scheduler=True)

    def check(app: GpuwatchApp) -> None:
        # THEN the header says why, the GPUs are there, and the JOB column says "-"
        cards = str(app.query_one("#section-0", Static).render())
        assert "jobs unknown: Slurm did not answer within 2s" in cards
        assert "[3]" in cards and "job 1234" not in cards
        table = app.table()
        column = table.get_column_index("job")
        assert {str(table.get_row_at(i)[column]).strip() for i in range(table.row_count)} == {"-"}

    # GIVEN a frame whose jobs are unknown, WHEN the screen shows it
    run_app(slurm_frame(unknown), check)


class _Slurm(JobsReader):
    """This node's Slurm, without a daemon: job 1234 holds GPUs 0 and 1; no idle times."""

    def read(self) -> NodeJobs:
        table = JobTable((Job("1234", "alice", "train-llm", (0, 1), None, None),), FROZEN_TIME)
        return NodeJobs(table, None, scheduler=True)


def test_without_a_daemon_the_screen_counts_idle_held_gpus_itself(tmp_path: Path) -> None:
    # GIVEN a node whose GPU 0 computes nothing and GPU 1 is busy, both held by job 1234,
    # read with no daemon to count idle time
    scenario = tmp_path / "node.toml"
    scenario.write_text(
        "".join(f'[[gpu]]\nload = "constant"\nutilization_pct = {pct}\n' for pct in (0, 70))
    )
    now = [FROZEN_TIME]
    backend = SimBackend(scenario, clock=lambda: now[0])
    source = LocalSource(backend, None, jobs=_Slurm(), monotonic=lambda: now[0])
    # WHEN the screen samples for longer than the idle window
    first = source.read()
    now[0] += IDLE_WINDOW_S + 5
    later = source.read()
    # THEN GPU 0 is marked allocated and idle since the first sample, GPU 1 is not
    gpus = later.snapshot.gpus  # type: ignore[union-attr]
    assert later.jobs is not None and later.jobs.idle_s(gpus[0]) == IDLE_WINDOW_S + 5
    assert later.jobs.idle_s(gpus[1]) is None
    # AND not before the window has passed
    assert first.jobs is not None and first.jobs.idle_s(first.snapshot.gpus[0]) is None  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_screen_names_a_pod_on_its_card() -> None:
    def check(app: GpuwatchApp) -> None:
        # THEN GPU 0's card names the pod and its container (cut to the card's width), as
        # `gpuwatch status` does
        cards = str(app.query_one("#section-0", Static).render())
        assert "pod ml/train-0 (container train" in cards and "job ml/train-0" not in cards

    # GIVEN a node whose GPU 0 a Kubernetes pod holds, WHEN the screen shows it
    run_app(pod_frame("trainer"), check)
