"""What hostile or broken Slurm inputs cost the readers, measured: each case runs in a process
of its own with a deadline, and prints its outcome, wall time and peak memory (or the
threads and processes left behind).

1. gres.conf `NodeName=a[0-65535]b[0-65535]`: `gpuwatch pick` in a step.
2. Hostlists of 1,500 brackets and of a 5,000-digit number.
3. gres.conf `include` of a FIFO; gres.conf including 63 files of 1 MB each.
4. A squeue printing 100 MB of `--json`: the job reader's and a daemon's peak memory.
5. A sacct printing SACCT_MB of rows: `job-report`'s Slurm read, its peak memory.
6. A squeue wrapper leaving a `setsid` child behind: processes left after 20 refreshes.
7. A daemon reloaded (SIGHUP) 5 times with the gres.conf of case 1, and with the FIFO:
   its threads after each.
8. A squeue job whose `gres_detail` has the wrong type: is it dropped silently?

Run: python bench/abuse_slurm.py [SACCT_MB]   (default 1000: 2 GB of memory without a cap)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from _common import REPO
from _slurm import many_jobs, stand_in_node

from gpuwatch.backends.daemon_client import http_get

NODE = REPO / "tests" / "jobs" / "data" / "slurm-node.toml"
DEADLINE_S = 60.0
GPUWATCH = [sys.executable, "-m", "gpuwatch"]


def measured(argv: list[str], env: dict[str, str], deadline_s: float = DEADLINE_S) -> str:
    """Runs `argv` until it ends or `deadline_s`: its last line of output, wall time and peak
    resident memory (its VmHWM, a high-water mark: polled while it runs, and as a Python
    snippet prints it last, for the figure after its last poll)."""
    start = time.monotonic()
    child = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    assert child.stdout is not None
    os.set_blocking(child.stdout.fileno(), False)
    out, peak_kib, note = b"", 0, ""
    while child.poll() is None:
        out += child.stdout.read() or b""
        peak_kib = max(peak_kib, vm_hwm_kib(child.pid))
        if time.monotonic() - start > deadline_s:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            note = " (killed at the deadline)"
            break
        time.sleep(0.05)
    wall_s = time.monotonic() - start
    out += child.stdout.read() or b""
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    for line in lines:
        if line.startswith("VmHWM "):
            peak_kib = max(peak_kib, int(line.split()[1]))
    said = [line for line in lines if not line.startswith("VmHWM ")]
    last = (said[-1][:150] if said else "(no output)") + note
    return f"{wall_s:7.2f} s  {peak_kib / 1024:8.1f} MiB peak  exit {child.returncode}: {last}"


def vm_hwm_kib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(status.split("VmHWM:")[1].split()[0]) if "VmHWM:" in status else 0


PEAK = """
    import re
    print("VmHWM", re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read())[1])
"""


def python(code: str, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code) + textwrap.dedent(PEAK)]


def step_env(work: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "GPUWATCH_SIM": str(NODE),
        "GPUWATCH_LEASE_DIR": str(work / "leases"),
        "SLURM_JOB_ID": "1",
        "SLURM_STEP_GPUS": "0",
        "SLURM_CONF": str(work / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
        "PYTHONPATH": str(REPO),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def hostlists(work: Path) -> None:
    (work / "slurm.conf").write_text("")
    (work / "gres.conf").write_text("NodeName=a[0-65535]b[0-65535] Name=gpu File=/dev/nvidia0\n")
    env = step_env(work)
    print("1. pick in a step, gres.conf NodeName=a[0-65535]b[0-65535]:")
    print("  ", measured([*GPUWATCH, "pick", "--", "true"], env))
    for name, expression in (
        ("1,500 brackets", "n" + "[1]" * 1500),
        ("5,000 digits", "n[" + "1" * 5000 + "]"),
    ):
        code = f"""
            from gpuwatch.jobs.hostlist import expand_hostlist
            try:
                print(len(expand_hostlist({expression!r})), "names")
            except Exception as error:
                print(type(error).__name__, str(error)[:100])
        """
        print(f"2. a hostlist of {name}:")
        print("  ", measured(python(code, env), env))


def includes(work: Path) -> None:
    env = step_env(work)
    read = """
        from pathlib import Path
        from gpuwatch.jobs.gres_conf import GresOrderUnknown, gpu_layout
        try:
            print(len(gpu_layout(Path({path!r}), None, "n1").slots), "GPUs")
        except GresOrderUnknown as error:
            print("GresOrderUnknown", str(error)[:100])
    """
    fifo = work / "fifo.conf"
    os.mkfifo(fifo)
    (work / "fifo-gres.conf").write_text(f"include {fifo}\n")
    print("3. gres.conf including a FIFO:")
    print("  ", measured(python(read.format(path=str(work / "fifo-gres.conf")), env), env, 20))
    line = "NodeName=n[0-9] Name=gpu File=/dev/nvidia[0-3]\n"
    big = line * ((1 << 20) // len(line))
    names = []
    for number in range(63):
        (work / f"part{number}.conf").write_text(big)
        names.append(f"include {work}/part{number}.conf\n")
    (work / "big-gres.conf").write_text("".join(names))
    print("3. gres.conf including 63 files of 1 MB, read for node n1 (as pick in a step):")
    print("  ", measured(python(read.format(path=str(work / "big-gres.conf")), env), env))


def stand_in(work: Path, squeue_body: str) -> dict[str, str]:
    """bench's stand-in node `vm` (bench/_slurm.py) whose squeue runs `squeue_body`, with
    this checkout's gpuwatch."""
    return {**stand_in_node(work, os.environ, squeue_body), "PYTHONPATH": str(REPO)}


READ_JOBS = """
    from gpuwatch.jobs import SlurmJobs
    reader = SlurmJobs(timeout_s=120)
    table = reader.table()
    doubts = len(getattr(table, "doubts", ())) if table is not None else 0
    print("jobs unknown: " + reader.unknown_why() if table is None else
          f"known, {len(table.jobs)} jobs, {doubts} doubts")
"""


def big_squeue(work: Path) -> None:
    """100 MB of the smallest running jobs on this node (the most objects a byte)."""
    answer = work / "answer.json"
    job = {"job_state": "RUNNING", "nodes": "vm", "gres_detail": [], "user_name": "u"}
    jobs = [{"job_id": n, **job, "name": "j", "start_time": 1} for n in range(1, 820_000)]
    answer.write_text(json.dumps({"jobs": jobs}))
    del jobs
    env = stand_in(work, f"cat {answer}")
    print(f"4. squeue printing {answer.stat().st_size / 1e6:.0f} MB of JSON (small jobs):")
    print("   the job reader:", measured(python(READ_JOBS, env), env, 180))
    with running_daemon(work, env) as daemon:
        start = time.monotonic()
        why = first_jobs_answer(work / "gpuwatch.sock", 180)
        wall_s = time.monotonic() - start
        time.sleep(20)  # a reading given up on by the daemon may still be parsing
        peak_mib = vm_hwm_kib(daemon.pid) / 1024
    print(f"   a daemon: {wall_s:7.2f} s  {peak_mib:8.1f} MiB peak: {why}")
    answer.unlink()


@contextlib.contextmanager
def running_daemon(work: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """`gpuwatch daemon --jobs slurm` over a simulated node, once it listens."""
    sock = work / "gpuwatch.sock"
    daemon = subprocess.Popen(
        [*GPUWATCH, "daemon", "--sim", str(NODE), "--socket", str(sock), "--jobs", "slurm"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not sock.exists():
            time.sleep(0.1)
        yield daemon
    finally:
        daemon.kill()
        daemon.wait()
        sock.unlink(missing_ok=True)


def first_jobs_answer(sock: Path, deadline_s: float) -> str:
    """What the daemon's /v1/jobs says once Slurm first answered (or the deadline)."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        status, body = http_get(str(sock), "/v1/jobs", 60)
        data = json.loads(body) if status == 200 else {}
        if data.get("known"):
            return f"known, {len(data['jobs'])} jobs"
        if data.get("error") and "not answered yet" not in data["error"]:
            return f"jobs unknown: {data['error'][:120]}"
        time.sleep(0.2)
    return "no answer by the deadline"


def big_sacct(work: Path, megabytes: int) -> None:
    row = "1234|1234|COMPLETED|2026-11-27T07:00:22|2026-11-27T08:00:22|vm\n"
    env = stand_in(work, "echo '{\"jobs\": []}'")
    sacct = work / "bin" / "sacct"
    sacct.write_text(f"#!/bin/sh\nyes '{row.strip()}' | head -c {megabytes * 1_000_000}\n")
    sacct.chmod(0o755)
    code = """
        from gpuwatch.jobs.job_runs import slurm_run
        import os
        try:
            run = slurm_run("1234", dict(os.environ), timeout_s=600)
            print("found" if run is not None else "no such job", getattr(run, "state", ""))
        except Exception as error:
            print(type(error).__name__, str(error)[:100])
    """
    print(f"5. job-report's Slurm read, sacct printing {megabytes} MB:")
    print("  ", measured(python(code, env), env, 600))


def marked(marker: str) -> int:
    """How many processes run `sleep MARKER`."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[1:2] == [
                marker.encode()
            ]:
                count += 1
        except (OSError, IndexError):
            continue
    return count


def setsid_children(work: Path) -> None:
    marker = "300.4242"
    answer = work / "answer.json"
    answer.write_text(many_jobs(3))
    env = stand_in(work, f"setsid sleep {marker} & cat {answer}")
    code = """
        from gpuwatch.jobs import SlurmJobs
        for _ in range(20):
            reader = SlurmJobs(timeout_s=2)
            table = reader.table()
        print("last:", "known" if table is not None else reader.unknown_why())
    """
    before = marked(marker)
    print("6. 20 refreshes through a squeue wrapper that starts `setsid sleep &`:")
    print("  ", measured(python(code, env), env, 120))
    time.sleep(1)
    print(f"   processes left behind: {marked(marker) - before}")
    for entry in Path("/proc").iterdir():  # this bench's own leftovers
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def reloads(work: Path, gres_conf: str, what: str) -> None:
    env = stand_in(work, f"cat {work / 'answer.json'}")
    (work / "answer.json").write_text(many_jobs(3))
    (work / "gres.conf").write_text(gres_conf)
    with running_daemon(work, env) as daemon:
        time.sleep(8)
        counts = [threads_of(daemon.pid)]
        for _ in range(5):
            daemon.send_signal(signal.SIGHUP)
            time.sleep(8)
            counts.append(threads_of(daemon.pid))
        why = first_jobs_answer(work / "gpuwatch.sock", 10)
    print(f"7. a daemon reloaded 5 times, gres.conf {what}: threads {counts}; {why}")


def wrong_type(work: Path) -> None:
    data = json.loads(many_jobs(2))
    data["jobs"][1]["gres_detail"] = {"0": "gpu:1(IDX:1)"}
    (work / "answer.json").write_text(json.dumps(data))
    env = stand_in(work, f"cat {work / 'answer.json'}")
    print("8. two jobs, the second's gres_detail an object, not a list:")
    print("  ", measured(python(READ_JOBS, env), env))


def main() -> None:
    sacct_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    cases = [
        hostlists,
        includes,
        big_squeue,
        lambda work: big_sacct(work, sacct_mb),
        setsid_children,
        lambda work: reloads(
            work, "NodeName=a[0-65535]b[0-65535] Name=gpu File=/dev/nvidia0\n", "of case 1"
        ),
        lambda work: reloads(work, f"include {work / 'fifo'}\n", "including a FIFO"),
        wrong_type,
    ]
    for case in cases:
        work = Path(tempfile.mkdtemp(prefix="gpuwatch-abuse-slurm-"))
        os.mkfifo(work / "fifo")
        try:
            case(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
