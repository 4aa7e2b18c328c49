"""What the host tells of a GPU process: user, command line, CPU, RSS and start, read from
live processes of this machine."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch import hostinfo
from gpuwatch.hostinfo import HostProcessTable, shell_command
from tests.helpers.wait import wait_until

SLEEP = shutil.which("sleep") or "/bin/sleep"
# A process that spends CPU when told ("burn" on its stdin), answers "done", then blocks.
BURNER = (
    "import sys, time\n"
    "for line in sys.stdin:\n"
    "    start = time.process_time()\n"
    "    while time.process_time() - start < 0.2:\n"
    "        pass\n"
    "    print('done', flush=True)\n"
)


class Burner:
    """A live process whose CPU time changes only when the test says so."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def burn(self) -> None:
        """Spends about 0.2 s of CPU, and returns once it is spent and the process blocks."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("burn\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "done\n"

    def cpu_s_and_start(self) -> tuple[float, float]:
        """Its CPU time and start, as psutil reads them: the independent reading."""
        process = psutil.Process(self.pid)
        times = process.cpu_times()
        return times.user + times.system, process.create_time()

    def stop(self) -> None:
        self.process.kill()
        self.process.communicate()  # reaps it and closes its pipes


@pytest.fixture
def burner() -> Iterator[Burner]:
    process = Burner()
    yield process
    process.stop()


def exec_done(process: subprocess.Popen[bytes]) -> int:
    """`process`'s pid once its command line is set up: Popen returns a moment before."""
    wait_until(lambda: psutil.Process(process.pid).cmdline(), "the command line to be set up")
    return process.pid


def freeze_time(monkeypatch: pytest.MonkeyPatch, now: float) -> list[float]:
    clock = [now]
    monkeypatch.setattr(hostinfo.time, "time", lambda: clock[0])
    return clock


def test_live_process_has_user_command_rss_and_start_time() -> None:
    # GIVEN this very process, which has been running for a while
    details = HostProcessTable().lookup({os.getpid()})[os.getpid()]
    assert details.user == pwd.getpwuid(os.getuid()).pw_name
    argv = Path(f"/proc/{os.getpid()}/cmdline").read_text().rstrip("\0").split("\0")
    assert shlex.split(details.command or "") == argv
    assert details.rss_bytes and details.rss_bytes > 1 << 20
    assert details.started_at is not None and details.started_at < time.time()
    assert details.started_at == pytest.approx(psutil.Process().create_time(), abs=0.02)
    assert details.cpu_pct is not None and details.cpu_pct > 0


def test_vanished_and_foreign_pids_give_no_details() -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert HostProcessTable().lookup({exited.pid, 2**22 + 7}) == {}


def test_cpu_is_lifetime_average_first_then_since_the_last_look(
    burner: Burner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a process that has used some CPU and now waits, looked at when its age is twice
    # the CPU time it has used
    burner.burn()
    cpu_s, started_at = burner.cpu_s_and_start()
    clock = freeze_time(monkeypatch, started_at + 2 * cpu_s)
    table = HostProcessTable()
    first = table.lookup({burner.pid})[burner.pid]
    # THEN the first look is the lifetime average: half a core
    assert first.cpu_pct == 50.0
    assert first.started_at == pytest.approx(started_at, abs=0.02)
    # AND its command line, its new lines made printable
    assert first.command == f"{sys.executable} -c {shlex.quote(BURNER)}".replace("\n", "?")
    # WHEN it uses more CPU, and is looked at again when that is 90 % of the time between
    burner.burn()
    more_s = burner.cpu_s_and_start()[0] - cpu_s
    clock[0] += more_s / 0.9
    # THEN the next look is the average since the last one
    assert table.lookup({burner.pid})[burner.pid].cpu_pct == 90.0


def _same_pid_again(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """`argv` started as `pid`, which has exited (root only: the kernel's next pid is set)."""
    for _ in range(50):  # other processes of this machine may take the pid first
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        process = subprocess.Popen(argv)
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    return None


def test_reused_pid_starts_measuring_afresh(
    burner: Burner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a process measured by the table, which then exits
    burner.burn()
    table = HostProcessTable()
    assert burner.pid in table.lookup({burner.pid})
    pid = burner.pid
    burner.stop()
    # WHEN its pid is given to another process
    other = _same_pid_again(pid, [SLEEP, "60"])
    if other is None:
        pytest.skip("the kernel's next pid can be set only by root, on a quiet machine")
    try:
        psutil_view = psutil.Process(pid)
        wait_until(lambda: psutil_view.cmdline() == [SLEEP, "60"], "sleep to be started")
        started_at = psutil_view.create_time()
        times = psutil_view.cpu_times()
        freeze_time(monkeypatch, started_at + 10.0)
        details = table.lookup({pid})[pid]
        # THEN it is the new process: its command, and its own lifetime average
        assert details.command == f"{SLEEP} 60"
        assert details.cpu_pct == round(10.0 * (times.user + times.system), 1)
    finally:
        other.kill()
        other.wait()


def test_a_process_without_command_line_is_named_by_its_name(tmp_path: Path) -> None:
    # GIVEN a process that named itself "weird) name (x" and has exited, unreaped: a zombie
    # keeps its name and loses its command line, as a kernel thread has none
    named = tmp_path / "weird) name (x"
    named.symlink_to(SLEEP)
    process = subprocess.Popen([str(named), "0"])
    try:
        wait_until(
            lambda: psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE,
            "the process to exit",
        )
        # THEN it is shown by its name
        assert HostProcessTable().lookup({process.pid})[process.pid].command == "weird) name (x"
    finally:
        process.wait()


def test_a_process_that_exits_is_forgotten_with_its_descriptor() -> None:
    sleeper = subprocess.Popen([SLEEP, "60"])
    table = HostProcessTable()
    open_before = len(os.listdir("/proc/self/fd"))
    try:
        assert sleeper.pid in table.lookup({sleeper.pid})
        assert len(os.listdir("/proc/self/fd")) == open_before + 1  # its stat, kept open
    finally:
        sleeper.kill()
        sleeper.wait()
    assert table.lookup({sleeper.pid}) == {}
    assert len(os.listdir("/proc/self/fd")) == open_before


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (
            ["python3", "-c", "import time; time.sleep(300)"],
            "python3 -c 'import time; time.sleep(300)'",
        ),
        (["python", "train.py", "--lr", "0.1"], "python train.py --lr 0.1"),
        (["sh", "-c", "echo it's"], "sh -c 'echo it'\"'\"'s'"),
        (["prog", "", "x"], "prog '' x"),
        (["postgres: checkpointer", ""], "postgres: checkpointer"),
    ],
    ids=["python-c", "plain", "single-quote", "empty-argument", "rewritten-title"],
)
def test_command_lines_are_quoted_as_a_shell_would(argv: list[str], shown: str) -> None:
    # GIVEN a command line as psutil splits it (a rewritten title keeps one empty argument
    # for its NUL padding) THEN it is shown as the line that would run it again
    assert shell_command(argv) == shown


def test_a_live_command_line_is_quoted_as_a_shell_would() -> None:
    # GIVEN a process started as `python3 -c 'import time; time.sleep(300)'`
    argv = ["python3", "-c", "import time; time.sleep(300)"]
    process = subprocess.Popen(argv, executable=sys.executable)
    try:
        # THEN its command is the line that would run it again
        pid = exec_done(process)
        shown = HostProcessTable().lookup({pid})[pid].command
        assert shown == "python3 -c 'import time; time.sleep(300)'"
    finally:
        process.kill()
        process.wait()


def test_a_command_line_with_terminal_escapes_is_made_printable() -> None:
    # GIVEN a process whose arguments hold an escape sequence and a right-to-left override
    argv = ["python3", "-c", "import time; time.sleep(60)", "\x1b[2J", "\u202egpj.exe"]
    process = subprocess.Popen(argv, executable=sys.executable)
    try:
        # WHEN the table describes it
        pid = exec_done(process)
        command = HostProcessTable().lookup({pid})[pid].command
        # THEN nothing in its command would act on a terminal
        assert command is not None and command.isprintable()
        assert command.endswith("'?[2J' '?gpj.exe'")
    finally:
        process.kill()
        process.wait()


@given(st.lists(st.text(min_size=1), min_size=2, max_size=6))
@settings(max_examples=200)
def test_a_quoted_command_splits_back_into_its_arguments(argv: list[str]) -> None:
    argv = [arg.replace("\0", "") or "x" for arg in argv]
    assert shlex.split(shell_command(argv)) == argv


def test_inside_another_pid_namespace_no_host_pid_is_attributed() -> None:
    # GIVEN gpuwatch in a PID namespace of its own, where pid 1 (the host's init to the
    # driver) names gpuwatch itself
    code = (
        "from gpuwatch.hostinfo import HostProcessTable\n"
        "table = HostProcessTable()\n"
        "print(table.pids_are_local, table.lookup({1, 2}))\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no PID namespace of its own here: {done.stderr.strip()}")
    # THEN none of them is given a local process's user or command
    assert done.stdout.split() == ["False", "{}"], done.stderr


def test_in_the_initial_pid_namespace_pids_are_looked_up() -> None:
    table = HostProcessTable()
    if not table.pids_are_local:
        pytest.skip("these tests run in a container's PID namespace")
    assert table.lookup({os.getpid()})[os.getpid()].command


def test_descriptors_stay_bounded_however_many_processes_and_all_get_details() -> None:
    # GIVEN a node with 300 GPU processes, and a table that keeps at most 100 files open
    sleepers = [subprocess.Popen([SLEEP, "60"]) for _ in range(300)]
    try:
        table = HostProcessTable(max_open_files=100)
        before = len(os.listdir("/proc/self/fd"))
        # WHEN it looks them up, twice (the second look re-reads what it knows)
        pids = {sleeper.pid for sleeper in sleepers}
        table.lookup(pids)
        found = table.lookup(pids)
        # THEN every process has its user, and no more than 100 descriptors are held
        assert len(found) == 300 and all(p.user for p in found.values())
        assert len(os.listdir("/proc/self/fd")) - before <= 100
        # AND a process that is no longer asked for gives its descriptor back
        table.lookup(set())
        assert len(os.listdir("/proc/self/fd")) <= before
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
