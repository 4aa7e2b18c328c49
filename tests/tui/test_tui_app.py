"""`gpuwatch tui`, level 2: the app driven by a Pilot, over the simulated backend."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpuwatch.backends import open_backend
from gpuwatch.tui.common.screens import HelpScreen
from gpuwatch.tui.common.widgets import SectionView
from gpuwatch.tui.node.app import GpuwatchApp
from gpuwatch.tui.node.keys import KEYS
from gpuwatch.tui.node.screens import ConfirmScreen, DetailScreen
from gpuwatch.tui.node.sources import LocalSource
from tests.helpers.cli import FROZEN_TIME
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.tui import (
    HungSource,
    QuietSource,
    fed_app,
    frame,
    gpu,
    process,
    sim_source,
    until,
)
from tests.helpers.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def text_of(app: GpuwatchApp, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def table_pids(app: GpuwatchApp) -> list[int]:
    table = app.table()
    return [
        int(str(table.get_row_at(i)[table.get_column_index("pid")]).strip(" *"))
        for i in range(table.row_count)
    ]


def sim_app(**options: object) -> GpuwatchApp:
    return GpuwatchApp([sim_source(4)], interval_s=0.1, clock=lambda: FROZEN_TIME, **options)  # type: ignore[arg-type]


def run(
    app: GpuwatchApp,
    body: Callable[[Pilot[int]], Awaitable[None]],
    size: tuple[int, int] = (160, 48),
) -> None:
    import asyncio

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.state.sections[0].frame is not None, "the first frame")
            await pilot.pause()
            await body(pilot)

    asyncio.run(main())


@pytest.fixture
def child() -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUWATCH_DETAIL_MARK": "visible"}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env)
    yield process  # type: ignore[misc]
    if process.poll() is None:
        process.kill()
    process.wait()


def test_first_frame_shows_every_gpu_and_process() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        cards = str(app.query_one(SectionView).render())
        for index in range(4):
            assert f"[{index}] NVIDIA H100 80GB HBM3" in cards
        assert "sim-node" in cards
        assert 40000 in table_pids(app)

    run(app, body)


def test_s_sorts_by_the_next_column_and_r_reverses() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        # GIVEN the default sort (GPU memory, largest first)
        assert "GPU-MEM ▼" in text_of(app, "#status")
        # WHEN s is pressed until the table is sorted by PID
        while app.sort_column != "pid":
            await pilot.press("s")
        await pilot.press("r")
        # THEN the rows are in pid order, reversed
        pids = table_pids(app)
        assert pids == sorted(pids, reverse=False) or pids == sorted(pids, reverse=True)
        await pilot.press("r")
        assert table_pids(app) == sorted(pids, reverse=app.sort_reverse)
        assert "PID" in text_of(app, "#status")

    run(app, body)


def test_the_sort_chosen_outlives_a_terminal_too_narrow_for_its_column() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        # GIVEN the table sorted by CPU%, lowest first, in a wide terminal
        while app.sort_column != "cpu":
            await pilot.press("s")
        if app.sort_reverse:
            await pilot.press("r")
        assert "sorted by CPU% ▲" in text_of(app, "#status")
        # WHEN the terminal narrows to 80 columns, which drop CPU%
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: "cpu" not in columns_shown(app), "CPU% to be dropped")
        # THEN the table says which order stands in
        await until(pilot, lambda: "GPU-MEM ▼" in text_of(app, "#status"), "the order shown")
        # AND when it widens again, CPU% sorts the table again, lowest first
        await pilot.resize_terminal(160, 48)
        await until(pilot, lambda: "cpu" in columns_shown(app), "CPU% to be back")
        await until(pilot, lambda: "CPU% ▲" in text_of(app, "#status"), "the order chosen")
        assert (app.sort_column, app.sort_reverse) == ("cpu", False)

    run(app, body)


def columns_shown(app: GpuwatchApp) -> list[str]:
    return [column.key for column in app.table().columns_shown]


def test_filter_by_user_keeps_only_their_rows() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        await pilot.press("slash", *"user:bob", "enter")
        table = app.table()
        users = {
            str(table.get_row_at(i)[table.get_column_index("user")]).strip()
            for i in range(table.row_count)
        }
        assert users == {"bob"}
        assert "filter: user:bob" in text_of(app, "#status")
        await pilot.press("escape")
        await until(pilot, lambda: app.table().row_count > 2, "the filter to clear")

    run(app, body)


def test_selection_stays_on_the_same_process_across_refreshes() -> None:
    app = fed_app()

    import asyncio

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            app.feed(
                0,
                frame([gpu(0)], [process(1, 0, gib=9), process(2, 0, gib=5), process(3, 0, gib=1)]),
            )
            await pilot.press("down")  # select pid 2
            assert app.selected_row().pid == 2  # type: ignore[union-attr]
            # WHEN pid 2's memory grows past the others and the order changes
            app.feed(
                0,
                frame(
                    [gpu(0)], [process(1, 0, gib=9), process(2, 0, gib=20), process(3, 0, gib=1)]
                ),
            )
            await pilot.pause()
            # THEN the row moved to the top and is still the one selected
            assert table_pids(app) == [2, 1, 3]
            assert app.selected_row().pid == 2  # type: ignore[union-attr]
            assert app.table().cursor_row == 0

    asyncio.run(main())


def test_help_lists_every_key_and_closes() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = " ".join(str(app.screen.query_one("#help-text", Static).render()).split())
        for key in KEYS:
            assert " ".join(key.label.split()) in shown
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    run(app, body)


def test_readonly_removes_signals_from_keys_and_help() -> None:
    app = sim_app(readonly=True)

    async def body(pilot: Pilot[int]) -> None:
        await pilot.press("t")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("question_mark")
        assert "SIGTERM" not in str(app.screen.query_one("#help-text", Static).render())
        assert "read-only" in text_of(app, "#title")

    run(app, body)


def test_enter_opens_the_detail_of_the_selected_process() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        row = app.selected_row()
        assert row is not None
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
        screen = app.screen
        assert isinstance(screen, DetailScreen)
        await until(
            pilot,
            lambda: "GPU memory" in str(screen.query_one("#detail-graphs", Static).render()),
            "graphs",
        )
        details = str(screen.query_one("#detail-text", Static).render())
        assert row.command is not None and row.command in details
        assert "Environment" in details and "Parents" in details
        await pilot.press("escape")
        assert not isinstance(app.screen, DetailScreen)

    run(app, body)


def test_detail_shows_the_environment_and_parents_of_our_own_process(
    child: subprocess.Popen[bytes],
) -> None:
    # GIVEN a row for a child of this test (its environment is ours to read)
    app = fed_app()

    import asyncio

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            app.feed(0, frame([gpu(0)], [process(child.pid, 0, command="sleeper")]))
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DetailScreen), "the detail screen")
            details = str(app.screen.query_one("#detail-text", Static).render())
            assert "GPUWATCH_DETAIL_MARK=visible" in details
            assert str(os.getpid()) in details.split("Parents")[1]

    asyncio.run(main())


@pytest.mark.parametrize("answer", ["y", "n"], ids=["confirmed", "cancelled"])
def test_sigterm_asks_first_naming_pid_user_and_command(
    child: subprocess.Popen[bytes], answer: str
) -> None:
    import asyncio
    import getpass

    app = fed_app()
    me = getpass.getuser()

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            started = __import__("psutil").Process(child.pid).create_time()
            app.feed(
                0,
                frame(
                    [gpu(0)],
                    [process(child.pid, 0, user=me, command="sleeper --long", started_at=started)],
                ),
            )
            # WHEN t is pressed on the child's row
            await pilot.press("t")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
            # THEN the confirmation names its pid, user and command
            shown = str(app.screen.query_one("#confirm-text", Static).render())
            assert f"pid {child.pid}" in shown and me in shown and "sleeper --long" in shown
            await pilot.press(answer)
            await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the answer")
            if answer == "y":
                await until(pilot, lambda: child.poll() is not None, "the child to end")
                assert child.returncode == -15
                assert "SIGTERM sent" in text_of(app, "#status")
            else:
                await pilot.pause(0.2)
                assert child.poll() is None

    asyncio.run(main())


def test_a_process_that_is_not_there_is_left_out_with_a_reason() -> None:
    import asyncio

    app = fed_app()

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            app.feed(0, frame([gpu(0)], [process(4_000_000, 0)]))  # beyond pid_max: never alive
            await pilot.press("k")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
            shown = str(app.screen.query_one("#confirm-text", Static).render())
            assert "No process to send SIGKILL to" in shown and "no such process here" in shown
            await pilot.press("y")  # nothing to send: a no-op
            await until(
                pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the dialog to close"
            )

    asyncio.run(main())


def test_a_lost_gpu_shows_its_error_and_the_others_stay(tmp_path: Path) -> None:
    scenario = tmp_path / "lost.toml"
    scenario.write_text('[[gpu]]\n\n[[gpu]]\nfault = "lost"\n\n[[gpu]]\n')
    app = GpuwatchApp([sim_source(scenario)], interval_s=0.1, clock=lambda: FROZEN_TIME)

    async def body(pilot: Pilot[int]) -> None:
        cards = str(app.query_one(SectionView).render())
        assert "error: GPU is lost" in cards.replace("\n", " ")
        assert "[0] NVIDIA" in cards and "[2] NVIDIA" in cards

    run(app, body)


def test_80x24_shows_gpus_and_a_usable_table() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        table = app.table()
        keys = [c.key for c in table.columns_shown]
        assert {"gpu", "pid", "user", "gpu_mem", "command"} <= set(keys)
        assert table.size.height >= 6
        assert "[0] NVIDIA" in str(app.query_one(SectionView).render())

    run(app, body, size=(80, 24))


def test_a_hung_backend_never_freezes_the_screen() -> None:
    # GIVEN a source whose driver call never returns
    source = HungSource()
    app = GpuwatchApp([source], interval_s=0.05, clock=lambda: FROZEN_TIME)
    import asyncio

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            try:
                # THEN the screen says so, and keys still work
                await until(
                    pilot,
                    lambda: "no sample for" in str(app.query_one(SectionView).render()),
                    "the stall notice",
                )
                await pilot.press("question_mark")
                assert isinstance(app.screen, HelpScreen)
            finally:
                source.release.set()

    asyncio.run(main())


def test_q_quits_with_status_0() -> None:
    app = sim_app()

    async def body(pilot: Pilot[int]) -> None:
        await pilot.press("q")

    run(app, body)
    assert app.return_code == 0


def test_several_hosts_get_a_section_each_and_a_host_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a stand-in ssh that runs the remote command here, one reachable host, one not
    import shutil
    import stat

    from gpuwatch.tui.node.sources import RemoteSource
    from tests.helpers.ssh import STAND_IN_SSH

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    gpuwatch = shutil.which("gpuwatch") or str(Path(sys.executable).with_name("gpuwatch"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(gpuwatch).parent}:/usr/bin:/bin")
    sources = [RemoteSource("alice@node7", sim="3"), RemoteSource("node9-unreachable", sim="2")]
    app = GpuwatchApp(sources, interval_s=0.2, clock=lambda: FROZEN_TIME)
    import asyncio

    async def main() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            views = list(app.query(SectionView))
            # THEN the reachable host's GPUs and processes are shown under its name
            await until(pilot, lambda: "[2] NVIDIA" in str(views[0].render()), "node7's GPUs")
            assert "alice@node7" in str(views[0].render())
            # AND the unreachable one says why, without hiding the other
            await until(pilot, lambda: "cannot reach" in str(views[1].render()), "node9's error")
            table = app.table()
            await until(pilot, lambda: table.row_count > 0, "remote processes")
            assert "host" in [c.key for c in table.columns_shown]
            assert str(table.get_row_at(0)[0]).strip() == "alice@node7"

    asyncio.run(main())


def test_an_added_panel_is_shown_and_handed_every_frame() -> None:
    # GIVEN a panel such as the training panel another part of gpuwatch adds
    from gpuwatch.tui.node.state import ScreenState
    from gpuwatch.tui.node.widgets import Panel

    class Counting(Panel):
        frames = 0

        def show_state(self, state: ScreenState, now: float) -> None:
            self.frames += 1
            processes = sum(
                len(s.frame.snapshot.processes)
                for s in state.sections
                if s.frame and s.frame.snapshot
            )
            self.update(f"processes seen: {processes}")

    panel = Counting(id="training")
    app = GpuwatchApp([QuietSource()], clock=lambda: FROZEN_TIME, sample=False, panels=[panel])
    import asyncio

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            app.feed(0, frame([gpu(0)], [process(1, 0), process(2, 0)]))
            await pilot.pause()
            # THEN it sits on the main screen and redraws from each frame
            assert panel.frames >= 1
            assert "processes seen: 2" in str(panel.render())

    asyncio.run(main())


def test_mig_devices_sit_under_their_gpu_and_name_where_processes_run() -> None:
    # GIVEN the example MIG node: GPU 0 split into two MIG devices, GPU 1 whole
    scenario = Path(__file__).resolve().parents[2] / "examples" / "mig-node.toml"
    app = GpuwatchApp([sim_source(scenario)], interval_s=0.1, clock=lambda: FROZEN_TIME)

    async def body(pilot: Pilot[int]) -> None:
        cards = str(app.query_one(SectionView).render())
        # THEN each MIG device has its line, with its profile
        assert "0:0 3g.40gb" in cards and "0:1 2g.20gb" in cards
        # AND the table says which MIG device each process runs in
        table = app.table()
        gpu_column = table.get_column_index("gpu")
        devices = {str(table.get_row_at(i)[gpu_column]).strip() for i in range(table.row_count)}
        assert {"0:0", "0:1", "1"} <= devices

    run(app, body)


@pytest.mark.parametrize("backend", ["daemon", "auto"], ids=["backend-daemon", "default-backend"])
def test_with_the_daemon_the_graphs_are_full_from_the_first_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    # GIVEN a daemon that has sampled for a while (3 GPUs at a constant 40%), read through
    # --backend daemon or through the default backend (`auto`, which wraps the daemon)
    with running_daemon(tmp_path) as (_, socket_path, _):
        wait_until(
            lambda: get_json(socket_path, "/v1/health")[1]["history"]["samples"] >= 15,
            "some history",
        )
        monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
        source = LocalSource(open_backend(backend), None, host_stats=None)
        # WHEN the screen opens on it (its own samples come only once a minute)
        app = GpuwatchApp([source], interval_s=60)
        import asyncio

        async def main() -> None:
            async with app.run_test(size=(160, 48)) as pilot:
                await until(pilot, lambda: app.state.sections[0].frame is not None, "a frame")
                await pilot.pause()
                section = app.state.sections[0]
                # THEN the header says where the past comes from, and the graph already
                # holds the daemon's samples, not just the one frame
                assert "from the daemon's history" in str(app.query_one(SectionView).render())
                assert len(section.trends[0].utilization) >= 15

        asyncio.run(main())


def test_as_root_the_confirmation_warns_that_anyones_job_can_stop() -> None:
    from gpuwatch.tui.node.signals import Plan, Target, confirm_text

    plan = Plan((Target(7, "bob", "python train.py", None),), (), as_root=True)
    shown = "".join(text for text, _ in confirm_text("SIGKILL", plan))
    assert shown.startswith("You are root: this can stop anyone's job.")
    assert "pid 7  bob  python train.py" in shown


def test_shift_t_shows_the_tree_and_asks_the_source_for_parents() -> None:
    # GIVEN two ranks of one launcher, with their parents known
    from msgspec.structs import replace

    from gpuwatch.tui.common.frames import Ancestor

    source = QuietSource()
    app = GpuwatchApp([source], clock=lambda: FROZEN_TIME, sample=False)
    ancestors = (
        Ancestor(100, 1, "alice", "torchrun"),
        Ancestor(101, 100, "alice", "python"),
        Ancestor(102, 100, "alice", "python"),
    )
    import asyncio

    async def main() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            fed = frame([gpu(0)], [process(101, 0, gib=8), process(102, 0, gib=4)])
            app.feed(0, replace(fed, ancestors=ancestors))
            # WHEN T is pressed
            await pilot.press("T")
            # THEN the launcher heads its ranks, the source is asked for parents from now on
            assert source.tree is True
            table = app.table()
            command = table.get_column_index("command")
            shown = [str(table.get_row_at(i)[command]).strip() for i in range(table.row_count)]
            assert shown == ["torchrun", "├─ python train.py", "└─ python train.py"]
            assert "tree view" in text_of(app, "#status")
            # AND T again gives the flat list back
            await pilot.press("T")
            assert table.row_count == 2

    asyncio.run(main())
