"""`gpuwatch pick`: in-process for its answers, in real processes for leases and exec."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.backends.daemon_client import peak_utilization
from gpuwatch.backends.sim import SimBackend
from tests.helpers.cli import FROZEN_TIME, run_cli
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.wait import wait_until

SIM4 = SimBackend(4, clock=lambda: FROZEN_TIME).sample()
UUID = {gpu.index: gpu.uuid for gpu in SIM4.gpus}
UUID8 = {gpu.index: gpu.uuid for gpu in SimBackend(8, clock=lambda: FROZEN_TIME).sample().gpus}


class Picks:
    """Starts `gpuwatch pick` processes and cleans up after them."""

    def __init__(self, sim: str) -> None:
        self.env = {**os.environ, "GPUWATCH_SIM": sim}
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "pick", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def finish(self, process: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str]:
        _, err = process.communicate(timeout=timeout_s)
        return process.returncode, err


@pytest.fixture
def idle(tmp_path: Path) -> Callable[[int], str]:
    """A scenario file of `count` GPUs nobody uses, for tests of what jobs do to each other."""

    def make(count: int) -> str:
        path = tmp_path / f"idle-{count}.toml"
        path.write_text(f"[[gpu]]\ncount = {count}\n")
        return str(path)

    return make


@pytest.fixture
def picks() -> Iterator[Callable[[str], Picks]]:
    made: list[Picks] = []

    def make(sim: str) -> Picks:
        made.append(Picks(sim))
        return made[-1]

    yield make
    for group in made:
        for process in group.started:
            if process.poll() is None:
                process.kill()
            process.communicate()


def held_until(go: Path, note: Path) -> list[str]:
    """A child command that notes its GPUs, then holds them until `go` exists."""
    script = f'echo "$CUDA_VISIBLE_DEVICES" > {note}; while [ ! -e {go} ]; do sleep 0.05; done'
    return ["--", "sh", "-c", script]


class TestAnswers:
    def test_prints_the_choice_and_says_no_lease_is_held(self) -> None:
        result = run_cli("pick", "--sim", "4", "-n", "2", "--allow-busy")
        assert result.exit_code == 0
        assert result.stdout == f"{UUID[3]},{UUID[2]}\n"
        assert "no lease is held, so another job may take these 2 GPUs" in result.stderr

    @pytest.mark.parametrize(
        ("args", "named"),
        [
            (["--sim", "4", "--allow-busy"], "this GPU"),
            (["--sim", "{mig}", "--mig", "any"], "this MIG device"),
        ],
        ids=["one-gpu", "one-mig-device"],
    )
    def test_print_only_names_what_it_chose_as_it_is(
        self, tmp_path: Path, args: list[str], named: str
    ) -> None:
        # GIVEN a node, and one GPU or MIG device asked for without a command
        mig = tmp_path / "mig.toml"
        mig.write_text('[[gpu]]\nmodel = "A100-80GB"\nmig = ["1g.10gb"]\n')
        # WHEN pick prints its choice
        result = run_cli("pick", *(arg.format(mig=mig) for arg in args))
        # THEN its warning speaks of one GPU, or of a MIG device, not of "these GPUs"
        assert result.exit_code == 0, result.stderr
        assert f"no lease is held, so another job may take {named};" in result.stderr

    def test_index_format_prints_nvidia_smi_indices_and_the_order_to_set(self) -> None:
        result = run_cli("pick", "--sim", "4", "-n", "2", "--format", "index", "--allow-busy")
        assert result.stdout == "3,2\n"
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in result.stderr

    def test_existing_visible_devices_is_the_set_to_choose_from(self) -> None:
        result = run_cli(
            "pick", "--sim", "4", "--allow-busy", env={"CUDA_VISIBLE_DEVICES": f"0,{UUID[1]}"}
        )
        assert result.stdout == f"{UUID[1]}\n"

    def test_not_enough_gpus_gives_a_reason_per_gpu_and_exit_code_4(self) -> None:
        result = run_cli("pick", "--sim", "4", "-n", "2", "--min-free", "75GiB", "--allow-busy")
        assert result.exit_code == 4
        assert result.stderr.splitlines()[0] == (
            "gpuwatch: error: 2 GPUs with 75.0GiB free wanted, 1 qualifies"
        )
        assert result.stderr.splitlines()[1:] == [
            "  GPU 0: 17.6GiB free < 75.0GiB",
            "  GPU 1: 43.1GiB free < 75.0GiB",
            "  GPU 2: 73.1GiB free < 75.0GiB",
            "  GPU 3: qualifies (79.1GiB free)",
        ]

    @pytest.mark.parametrize(
        ("args", "env", "message"),
        [
            (
                ["-n", "0"],
                {},
                "Invalid value for '-n' / '--gpus': '0' is out of range: give 1 to 1,024",
            ),
            (["-n", "5"], {}, "5 GPUs asked for, but this machine has 4"),
            (
                ["--exclude", "0,1,2,3"],
                {},
                "1 GPU asked for, but this machine has 0 after --exclude",
            ),
            (
                ["-n", "3"],
                {"CUDA_VISIBLE_DEVICES": "0,1"},
                "3 GPUs asked for, but CUDA_VISIBLE_DEVICES allows 2",
            ),
            (["--min-free", "8XB"], {}, "Invalid value for '--min-free': '8XB' is not a size"),
            (["--timeout", "soon"], {}, "Invalid value for '--timeout': 'soon' is not a duration"),
            (
                ["--max-util", "150"],
                {},
                "Invalid value for '--max-util': '150' is out of range: give 0 to 100",
            ),
            (["--strategy", "best"], {}, "Invalid value for '--strategy': 'best'"),
            (["--exclude", "9"], {}, "--exclude: no GPU 9 on this machine"),
            ([], {"CUDA_VISIBLE_DEVICES": "0,zero"}, "'zero' is not a GPU index"),
            ([], {"CUDA_VISIBLE_DEVICES": "7"}, "no GPU 7 on this machine"),
            (["--bogus"], {}, "No such option '--bogus'"),
            (["--mem", "0GiB"], {}, "'0GiB' declares no memory"),
        ],
        ids=[
            "n-zero",
            "n-above-gpu-count",
            "one-gpu-all-excluded",
            "n-above-visible",
            "bad-size",
            "bad-timeout",
            "bad-percentage",
            "bad-strategy",
            "exclude-unknown",
            "malformed-visible-devices",
            "visible-device-missing",
            "unknown-option",
            "mem-zero",
        ],
    )
    def test_bad_input_is_one_line_and_exit_code_2(
        self, args: list[str], env: dict[str, str], message: str
    ) -> None:
        result = run_cli("pick", "--sim", "4", *args, env=env)  # type: ignore[arg-type]
        assert result.exit_code == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("gpuwatch: error: ") and message in result.stderr

    def test_help_teaches_with_examples(self) -> None:
        result = run_cli("pick", "--help")
        assert result.exit_code == 0
        assert "Examples:" in result.stdout and "--wait" in result.stdout
        assert "pick" in run_cli("--help").stdout


SIM8_IN_USE = {0, 1, 2, 4, 5, 6}  # alice, svc-infer and bob compute there; GPUs 3 and 7 idle


class TestGpusInUse:
    """Without --mem, pick gives only GPUs nobody uses."""

    @pytest.mark.slow
    def test_five_jobs_started_together_get_only_the_two_idle_gpus(
        self, picks: Callable[[str], Picks], tmp_path: Path
    ) -> None:
        # GIVEN the simulated 8-GPU node, and five jobs started together
        group, go = picks("8"), tmp_path / "go"
        notes = [tmp_path / f"job{n}" for n in range(5)]
        jobs = [group.start(*held_until(go, note)) for note in notes]
        wait_until(
            lambda: sum(n.exists() for n in notes) + sum(j.poll() is not None for j in jobs) >= 5,
            "every job to hold or fail",
            timeout_s=60,
            interval_s=0.02,
        )
        go.touch()
        results = [group.finish(job) for job in jobs]
        # THEN two run, on GPUs 3 and 7, and three are refused with exit code 4
        held = sorted(note.read_text().strip() for note in notes if note.exists())
        assert held == sorted([UUID8[3], UUID8[7]])
        assert sorted(code for code, _ in results) == [0, 0, 4, 4, 4]

    @pytest.mark.parametrize(
        "args", [["-n", "3"], ["-n", "3", "--strategy", "pack"], ["-n", "8"]], ids=str
    )
    def test_too_few_idle_gpus_is_exit_4_with_who_uses_each(self, args: list[str]) -> None:
        result = run_cli("pick", "--sim", "8", *args)
        assert result.exit_code == 4
        lines = result.stderr.splitlines()
        assert "6 GPUs in use left out: --mem SIZE shares one, --allow-busy" in lines[0]
        for index in SIM8_IN_USE:
            assert lines[1 + index].startswith(f"  GPU {index}: in use by "), lines
        assert lines[1 + 5].startswith(
            "  GPU 5: in use by svc-infer, pids 40500 40501, 36.0GiB used, "
        )
        assert lines[1 + 3].startswith("  GPU 3: qualifies")

    @pytest.mark.parametrize(
        ("args", "chosen"),
        [
            (["--allow-busy", "--min-free", "70GiB"], {3, 7, 2, 6}),
            (["--mem", "10GiB"], set(range(8)) - {0, 4}),
            (["--max-used", "8GiB", "--max-util", "100"], {3, 7}),
        ],
        ids=["allow-busy", "mem-shares", "raised-limits-still-not-others-processes"],
    )
    def test_options_widen_the_choice(self, args: list[str], chosen: set[int]) -> None:
        result = run_cli("pick", "--sim", "8", "--format", "index", *args)
        assert result.exit_code == 0, result.stderr
        assert int(result.stdout) in chosen


class TestRecentUtilization:
    def test_a_gpu_busy_in_the_last_minute_is_in_use_when_the_daemon_tells(
        self, tmp_path: Path
    ) -> None:
        # GIVEN a daemon that saw GPU 0 60 % busy, and GPU 0 idle since
        busy = '[[gpu]]\nload = "constant"\nutilization_pct = 60\n[[gpu]]\n'
        with running_daemon(tmp_path, scenario=busy) as (_, socket_path, scenario):
            env = {"GPUWATCH_SOCKET": str(socket_path)}
            wait_until(
                lambda: (
                    get_json(socket_path, "/v1/snapshot")[1]["gpus"][0]["utilization_pct"] == 60
                ),
                "the daemon to see GPU 0 busy",
                timeout_s=60,
                interval_s=0.02,
            )
            quiet = scenario.with_suffix(".new")
            quiet.write_text("[[gpu]]\n[[gpu]]\n")
            quiet.replace(scenario)
            wait_until(
                lambda: get_json(socket_path, "/v1/snapshot")[1]["gpus"][0]["utilization_pct"] == 0,
                "the daemon to see GPU 0 idle",
                timeout_s=60,
                interval_s=0.02,
            )
            # WHEN two GPUs are picked through the daemon
            result = run_cli("pick", "--backend", "daemon", "-n", "2", env=env)
            # THEN GPU 0 is in use, for what it did in the last minute
            assert result.exit_code == 4, result.stderr
            assert "GPU 0: in use: 60% busy in the last minute > 5%" in result.stderr
            # AND one GPU is GPU 1; --allow-busy takes GPU 0 too
            one = run_cli("pick", "--backend", "daemon", "--format", "index", env=env)
            assert one.stdout == "1\n"
            both = run_cli("pick", "--backend", "daemon", "-n", "2", "--allow-busy", env=env)
            assert both.exit_code == 0, both.stderr

    @pytest.mark.parametrize(
        ("answer", "peaks"),
        [
            ({"gpus": [{"uuid": "GPU-a", "utilization_pct": [0, None, 40, 3]}]}, {"GPU-a": 40.0}),
            ({"gpus": [{"uuid": "GPU-a", "utilization_pct": [None]}]}, {}),
            (
                {"gpus": [{"uuid": "GPU-a", "utilization_pct": [1e9, -1, True, "9", 2]}]},
                {"GPU-a": 2.0},
            ),
            ({"gpus": [{"uuid": 7, "utilization_pct": [50]}, "x", None]}, {}),
            ({"gpus": "all"}, {}),
            ([], {}),
        ],
        ids=["peak", "unknown", "out-of-range", "bad-series", "bad-gpus", "not-an-object"],
    )
    def test_only_percentages_of_named_gpus_are_read_from_the_history(
        self, answer: object, peaks: dict[str, float]
    ) -> None:
        assert peak_utilization(answer) == peaks


class TestRunningCommands:
    def test_command_runs_in_place_with_its_exit_status(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        group = picks(idle(2))
        process = group.start("--", "sh", "-c", 'echo "$$ $CUDA_VISIBLE_DEVICES"; exit 7')
        out, _ = process.communicate(timeout=60)
        pid, visible = out.split()
        assert int(pid) == process.pid, "the command replaces pick: same pid"
        assert visible.startswith("GPU-") and process.returncode == 7

    def test_signals_reach_the_command(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        process = picks(idle(2)).start("--", "sh", "-c", "echo ready; exec sleep 60")
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        assert process.returncode == -signal.SIGTERM

    def test_the_lease_records_the_command_quoted_as_a_shell_takes_it(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        # GIVEN a command whose arguments hold spaces and quotes
        script = 'cat "$GPUWATCH_LEASE_DIR"/*.lease'
        # WHEN pick runs it, and it prints its own lease
        process = picks(idle(1)).start("--", "sh", "-c", script, "it's")
        out, err = process.communicate(timeout=60)
        # THEN the lease's command gives back the same arguments to a shell
        assert process.returncode == 0, err
        command = json.loads(out)["command"]
        assert command == "sh -c 'cat \"$GPUWATCH_LEASE_DIR\"/*.lease' 'it'\"'\"'s'"
        assert shlex.split(command) == ["sh", "-c", script, "it's"]

    @pytest.mark.parametrize(
        ("command", "code", "message"),
        [(["no-such-command-here"], 127, "command not found"), (["/"], 126, "permission denied")],
        ids=["not-found", "not-executable"],
    )
    def test_command_that_cannot_run_gets_the_shells_exit_code(
        self,
        picks: Callable[[str], Picks],
        idle: Callable[[int], str],
        command: list[str],
        code: int,
        message: str,
    ) -> None:
        group = picks(idle(2))
        returncode, err = group.finish(group.start("--", *command))
        assert returncode == code and message in err

    @pytest.mark.slow
    def test_concurrent_picks_get_disjoint_gpus(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str], tmp_path: Path
    ) -> None:
        # GIVEN 12 jobs started at once on 8 GPUs, each holding its GPU until told to stop
        group, go = picks(idle(8)), tmp_path / "go"
        notes = [tmp_path / f"job{n}" for n in range(12)]
        jobs = [group.start(*held_until(go, note)) for note in notes]
        failed = []
        wait_until(
            lambda: (
                sum(note.exists() for note in notes) + sum(job.poll() is not None for job in jobs)
                >= 12
            ),
            "every job to hold or fail",
            timeout_s=60,
            interval_s=0.02,
        )
        failed = [job for job in jobs if job.poll() is not None]
        go.touch()
        results = [group.finish(job) for job in jobs]
        # THEN 8 hold 8 different GPUs, and 4 are refused with exit code 4
        held = [note.read_text().strip() for note in notes if note.exists()]
        assert len(held) == 8 and len(set(held)) == 8
        assert len(failed) == 4 and all(
            code == 4 for code, _ in (results[jobs.index(job)] for job in failed)
        )

    def test_sigkilled_job_frees_its_gpu_at_once(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str], tmp_path: Path
    ) -> None:
        group = picks(idle(1))
        holder = group.start("--", "sh", "-c", "echo ready; exec sleep 60")
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        assert run_cli("pick", "--sim", idle(1)).exit_code == 4
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
        assert run_cli("pick", "--sim", idle(1)).exit_code == 0

    @pytest.mark.slow
    def test_waiters_are_served_in_order_and_never_overlap(
        self,
        picks: Callable[[str], Picks],
        idle: Callable[[int], str],
        tmp_path: Path,
        lease_dir: Path,
    ) -> None:
        group, log = picks(idle(1)), tmp_path / "log"
        go = {name: tmp_path / f"go-{name}" for name in "ABC"}

        def job(name: str) -> list[str]:
            script = (
                f"echo start {name} >> {log}; while [ ! -e {go[name]} ]; "
                f"do sleep 0.05; done; echo end {name} >> {log}"
            )
            return ["--", "sh", "-c", script]

        def tickets() -> int:
            return len(list(lease_dir.glob("*.wait")))

        first = group.start(*job("A"))
        wait_until(log.exists, "A to start", timeout_s=60, interval_s=0.02)
        second = group.start("--wait", *job("B"))
        wait_until(lambda: tickets() == 1, "B to queue", timeout_s=60, interval_s=0.02)
        third = group.start("--wait", *job("C"))
        wait_until(lambda: tickets() == 2, "C to queue", timeout_s=60, interval_s=0.02)
        for behind, name, process in ((2, "A", first), (1, "B", second), (0, "C", third)):
            wait_until(
                lambda name=name: f"start {name}" in log.read_text(),
                f"{name} to start",
                timeout_s=60,
                interval_s=0.02,
            )
            # the jobs behind it are all still in line: none was let in beside it
            assert tickets() == behind, log.read_text()
            go[name].touch()
            assert group.finish(process)[0] == 0
        assert log.read_text().split("\n")[:-1] == [
            "start A",
            "end A",
            "start B",
            "end B",
            "start C",
            "end C",
        ]

    def test_wait_gives_up_after_the_timeout_with_exit_code_5(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        group = picks(idle(1))
        holder = group.start("--", "sh", "-c", "echo ready; exec sleep 60")
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        result = run_cli("pick", "--sim", idle(1), "--timeout", "0.3s")
        assert result.exit_code == 5
        assert result.stderr.startswith(
            "gpuwatch: waiting for 1 idle GPU, 0 qualify now (Ctrl-C to give up)\n"
        )
        assert "gave up after waiting" in result.stderr
        assert f"GPU 0: leased by pid {holder.pid}" in result.stderr

    def test_waiting_counts_one_qualifying_gpu_in_the_singular(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        # GIVEN one of two GPUs held WHEN a pick waits for both
        group = picks(idle(2))
        holder = group.start("--", "sh", "-c", "echo ready; exec sleep 60")
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        result = run_cli("pick", "--sim", idle(2), "-n", "2", "--timeout", "0.3s")
        # THEN the wait says "1 qualifies"
        assert result.exit_code == 5
        assert result.stderr.startswith("gpuwatch: waiting for 2 idle GPUs, 1 qualifies now")


class TestLeaseEdges:
    def test_a_lease_naming_pid_1_is_respected(self, lease_dir: Path) -> None:
        # GIVEN a container's first process holding GPU 0 (its lease says pid 1)
        lease_dir.mkdir(mode=0o1777, exist_ok=True)
        record = {
            "gpu_uuid": UUID[0],
            "gpu_index": 0,
            "pid": 1,
            "command": "python",
            "started_at": 0.0,
        }
        path = lease_dir / "00000000000000000001-1-c0ffee.lease"
        path.write_text(json.dumps(record))
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            result = run_cli("pick", "--sim", "4", "--exclude", "1,2,3")
        finally:
            os.close(fd)
        # THEN nobody else is given GPU 0
        assert result.exit_code == 4
        assert "GPU 0: leased by pid 1" in result.stderr

    def test_a_script_closing_its_low_descriptors_keeps_the_lease(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        script = "exec 3>/dev/null 4>/dev/null 5>/dev/null 6>/dev/null; echo ready; exec sleep 60"
        holder = picks(idle(1)).start("--", "sh", "-c", script)
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        assert run_cli("pick", "--sim", idle(1)).exit_code == 4

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("", "CUDA_VISIBLE_DEVICES='' hides every GPU"),
            ("-1", "CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
            ("MIG-6f3a2b1c-0000", "names only MIG devices, but no GPU on this machine has"),
        ],
        ids=["empty", "minus-one", "mig-only"],
    )
    def test_visible_devices_that_hide_every_gpu_mean_no_gpu(
        self, value: str, message: str
    ) -> None:
        result = run_cli("pick", "--sim", "4", env={"CUDA_VISIBLE_DEVICES": value})
        assert result.exit_code == 3
        assert message in result.stderr

    def test_a_nested_pick_may_use_the_gpus_of_the_job_it_runs_in(
        self, picks: Callable[[str], Picks], idle: Callable[[int], str]
    ) -> None:
        inner = f"{sys.executable} -m gpuwatch pick -- printenv CUDA_VISIBLE_DEVICES"
        outer = picks(idle(1)).start("--", "sh", "-c", f"printenv CUDA_VISIBLE_DEVICES; {inner}")
        out, err = outer.communicate(timeout=60)
        assert outer.returncode == 0, err
        first, second = out.split()
        assert first == second == UUID[0]
