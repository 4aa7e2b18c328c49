"""What Slurm adds to `gpuwatch status`: whole-process wall time, median of several runs,
on a 4-GPU node (fakenvml, tests/jobs/data/slurm-node.txt) without Slurm and with Slurm.

Cases, run interleaved so that the machine's load hits all alike:
- no Slurm: no squeue on the PATH (what a laptop or a node without Slurm pays);
- a stand-in squeue printing 50 running jobs (4 holding a GPU), in Slurm 22.05's JSON:
  with the cache file cold (removed before each run: squeue is run) and warm (another
  status wrote it a moment ago);
- the same node with --no-jobs;
- a hung squeue: cold (the deadline, 1 s) and warm ("jobs unknown" cached for 10 s);
- with --real (as root, slurm-wlm and munge installed): the tests' one-node Slurm 22.05
  (tests/helpers/slurm.py) with 50 running `sleep` jobs, cold and warm;
- through a running daemon (the deployed case: status reads `/v1/snapshot` and `/v1/jobs`,
  the daemon asks Slurm): one on a node without Slurm, one reading the stand-in's 50 jobs,
  one whose squeue hangs (status shows "jobs unknown" at once: the daemon waits, not it).

Run: python bench/status_slurm_cost.py [RUNS] [--real]   (target: +30 ms at most, cold)
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from _common import REPO, build_fakenvml, fakenvml_env
from _slurm import cluster, many_jobs, stand_in_node, why_not

sys.path.insert(0, str(REPO))

from gpuwatch.backends.daemon_client import http_get

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
SCENARIO = REPO / "tests" / "jobs" / "data" / "slurm-node.txt"
JOBS = 50
CACHE = "gpuwatch-jobs.json"


class Case:
    """One way of running status: its argv, environment, and what to do before each run."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        argv: tuple[str, ...] = (),
        before: Callable[[], None] | None = None,
        runs: int | None = None,
    ) -> None:
        self.name, self.env, self.argv, self.before, self.runs = name, env, argv, before, runs
        self.times_ms: list[float] = []
        self.cpu_ms: list[float] = []

    def run_once(self) -> str:
        if self.before is not None:
            self.before()
        cpu, start = _children_cpu_s(), time.perf_counter()
        done = subprocess.run(
            [GPUWATCH, "status", *self.argv],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        self.times_ms.append((time.perf_counter() - start) * 1000)
        self.cpu_ms.append((_children_cpu_s() - cpu) * 1000)
        if done.returncode != 0:
            sys.exit(f"{self.name}: gpuwatch status failed: {done.stderr.strip()}")
        return done.stdout


def _children_cpu_s() -> float:
    """CPU time of the processes run so far, with theirs (squeue, the stand-ins)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def forget(run_dir: Path) -> Callable[[], None]:
    return lambda: (run_dir / CACHE).unlink(missing_ok=True)


def without_slurm(base: dict[str, str], work: Path) -> dict[str, str]:
    quiet = work / "no-slurm-bin"
    quiet.mkdir(exist_ok=True)
    no_slurm = {**base, "PATH": f"{quiet}:{Path(sys.executable).parent}"}
    no_slurm.pop("SLURM_CONF", None)
    return no_slurm


def answering_node(root: Path, base: dict[str, str]) -> dict[str, str]:
    """A stand-in node whose squeue prints JOBS running jobs."""
    root.mkdir(parents=True)
    (root / "answer.json").write_text(many_jobs(JOBS))
    return stand_in_node(root / "node", base, f'cat "{root / "answer.json"}"')


def stand_in_cases(base: dict[str, str], work: Path) -> list[Case]:
    no_slurm = without_slurm(base, work)
    busy = answering_node(work / "busy", base)
    hung = stand_in_node(work / "hung", base, "exec sleep 600")
    busy_run, hung_run = Path(busy["XDG_RUNTIME_DIR"]), Path(hung["XDG_RUNTIME_DIR"])
    return [
        Case("no Slurm (no squeue)", no_slurm),
        Case(f"stand-in squeue, {JOBS} jobs, cache cold", busy, before=forget(busy_run)),
        Case(f"stand-in squeue, {JOBS} jobs, cache warm", busy),
        Case("Slurm node, --no-jobs", busy, ("--no-jobs",)),
        Case("hung squeue, cache cold", hung, before=forget(hung_run), runs=3),
        Case("hung squeue, cache warm", hung),
    ]


def real_cases(base: dict[str, str], work: Path, stack: ExitStack) -> list[Case]:
    reason = why_not()
    if reason is not None:
        sys.exit(f"--real: cannot start a Slurm here: {reason}")
    slurm = stack.enter_context(cluster(work / "slurm", JOBS))
    ids = [slurm.sbatch("--gres=gpu:1", wrap="sleep 900") for _ in range(4)]
    ids += [slurm.sbatch(wrap="sleep 900") for _ in range(JOBS - 4)]
    slurm.wait_running(ids, timeout_s=120)
    run_dir = work / "real-run"
    run_dir.mkdir(mode=0o700)
    env = {
        **base,
        "SLURM_CONF": str(slurm.conf),
        "SLURMD_NODENAME": slurm.node,
        "XDG_RUNTIME_DIR": str(run_dir),
        "PATH": f"{base['PATH']}:/usr/sbin",
    }
    cases = [
        Case(f"real Slurm 22.05, {JOBS} jobs, cache cold", env, before=forget(run_dir)),
        Case(f"real Slurm 22.05, {JOBS} jobs, cache warm", env),
    ]
    return cases


@contextmanager
def daemon(folder: Path, env: dict[str, str]) -> Iterator[str]:
    """`gpuwatch daemon` on the fakenvml node with `env`, asking Slurm (where it finds
    squeue) every 5 s; yields its socket once it serves and has read the jobs once."""
    folder.mkdir()
    sock = str(folder / "gpuwatch.sock")
    argv = [GPUWATCH, "daemon", "--socket", sock, "--jobs-refresh", "5s"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not _jobs_settled(sock):
            if time.monotonic() > deadline or process.poll() is not None:
                sys.exit(f"the daemon in {folder} did not start: {process.stderr}")
            time.sleep(0.2)
        yield sock
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _jobs_settled(sock: str) -> bool:
    """Whether the daemon at `sock` serves, and knows the jobs or reads no scheduler."""
    try:
        status, body = http_get(sock, "/v1/jobs")
    except OSError:  # not up yet
        return False
    settled = (b'"known": true', b'"reading": false', b'"error": "Slurm did not answer')
    return status == 200 and any(word in body for word in settled)


def daemon_cases(base: dict[str, str], work: Path, stack: ExitStack) -> list[Case]:
    no_slurm = without_slurm(base, work)
    busy = answering_node(work / "daemon-busy", base)
    hung = stand_in_node(work / "hung-for-daemon", base, "exec sleep 600")
    quiet_sock = stack.enter_context(daemon(work / "daemon-quiet", no_slurm))
    busy_sock = stack.enter_context(daemon(work / "daemon-slurm", busy))
    hung_sock = stack.enter_context(daemon(work / "daemon-hung", hung))
    return [
        Case("daemon, no Slurm", {**no_slurm, "GPUWATCH_SOCKET": quiet_sock}),
        Case(f"daemon reading {JOBS} jobs", {**busy, "GPUWATCH_SOCKET": busy_sock}),
        Case("daemon, its squeue hung", {**hung, "GPUWATCH_SOCKET": hung_sock}),
    ]


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    runs = int(args[0]) if args else 15
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-status-slurm-"))
    base = fakenvml_env(build_fakenvml(), SCENARIO)
    # Timed as users run it: from bytecode, not compiling every module on each start.
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "gpuwatch")], check=True)
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '')}"
    base.pop("GPUWATCH_SOCKET", None)
    base["GPUWATCH_SOCKET"] = str(work / "no-daemon.sock")  # the driver, not a daemon
    cases = stand_in_cases(base, work)
    stack = ExitStack()
    try:
        if "--real" in sys.argv:
            cases += real_cases(base, work, stack)
        cases += daemon_cases(base, work, stack)
        for case in cases:  # a warm-up, and a check that each case shows what it should
            print(f"  [{case.name}] {_gist(case.run_once())}")
            case.times_ms.clear()
        for number in range(runs):
            for case in cases:
                if case.runs is None or number < case.runs:
                    case.run_once()
    finally:
        stack.close()
        shutil.rmtree(work, ignore_errors=True)
    report(cases, runs)


def _gist(output: str) -> str:
    lines = output.splitlines()
    jobs = [line.strip() for line in lines if line.startswith(("  job ", "jobs unknown"))]
    return f"{len(jobs)} job line(s): {jobs[0] if jobs else '-'}"


def report(cases: list[Case], runs: int) -> None:
    wall0 = statistics.median(cases[0].times_ms)
    cpu0 = statistics.median(cases[0].cpu_ms)
    print(
        f"\ngpuwatch status, whole process, median of each ({os.cpu_count()} CPUs); "
        "CPU: the process and its children (squeue):"
    )
    for case in cases:
        wall, cpu = statistics.median(case.times_ms), statistics.median(case.cpu_ms)
        print(
            f"  {case.name:<44} wall {wall:7.1f} ms ({wall - wall0:+6.1f})  "
            f"CPU {cpu:6.1f} ms ({cpu - cpu0:+5.1f})  {len(case.times_ms)} runs"
        )


if __name__ == "__main__":
    main()
