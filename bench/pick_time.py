"""What `gpuwatch pick` costs a job: start-up time, and NVML calls per selection.

- `gpuwatch pick -n 2 --allow-busy -- true` (chosen by free memory, as nvisel chooses) beside
  `nvisel -n 2` and a bare `python -c pass`, and `gpuwatch pick -- true` (an idle GPU: the
  node has one), on the simulated 8-GPU node of ../shared/fakenvml (no simulated latency:
  pure software cost);
- `python -c "import gpuwatch; gpuwatch.select(fallback='cpu')"` on a machine without the
  NVIDIA library, beside the bare interpreter;
- NVML calls of one selection (FAKENVML_STATS), beside nvisel's;
- 32 picks started at once on a simulated 32-GPU node: all get different GPUs.

Run: python bench/pick_time.py [RUNS]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from _common import build_fakenvml, fakenvml_env, median_wall_ms, tool, total_calls

PYTHON = sys.executable
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))  # the console script users run


def startup(library: Path, runs: int) -> None:
    leases = tempfile.mkdtemp()
    env = fakenvml_env(library, GPUWATCH_LEASE_DIR=leases)
    commands = {
        "python -c pass": [PYTHON, "-c", "pass"],
        "gpuwatch pick -n 2 --allow-busy -- true": [
            *(GPUWATCH, "pick", "-n", "2", "--allow-busy", "--", "true")
        ],
        "gpuwatch pick -- true": [GPUWATCH, "pick", "--", "true"],
    }
    if nvisel := tool("nvisel"):
        commands["nvisel -n 2"] = [nvisel, "-n", "2"]
    medians = median_wall_ms(commands, env, runs)
    no_driver = fakenvml_env(Path(tempfile.mkdtemp()), GPUWATCH_LEASE_DIR=leases)
    cpu = median_wall_ms(
        {
            "python -c pass": [PYTHON, "-c", "pass"],
            "select(fallback='cpu')": [
                PYTHON,
                "-c",
                "import gpuwatch; gpuwatch.select(fallback='cpu')",
            ],
        },
        no_driver,
        runs,
    )
    bare = medians["python -c pass"]
    print(f"median wall time over {runs} runs (fakenvml, 8 GPUs, 40 processes):")
    for name, ms in medians.items():
        print(f"  {name:<40} {ms:7.1f} ms   {ms - bare:+7.1f} ms over bare python")
    if "nvisel -n 2" in medians:
        ratio = medians["gpuwatch pick -n 2 --allow-busy -- true"] / medians["nvisel -n 2"]
        print(f"  pick -n 2 --allow-busy / nvisel -n 2     {ratio:7.2f}x")
    print("without the NVIDIA library:")
    for name, ms in cpu.items():
        print(f"  {name:<30} {ms:7.1f} ms   {ms - cpu['python -c pass']:+7.1f} ms over bare python")


def nvml_calls(library: Path) -> None:
    work = Path(tempfile.mkdtemp())
    counts = {}
    # Print mode: the same selection, but the process exits normally, so the stats get written
    # (an exec'd command replaces the process before the library could write them).
    runs = {
        "gpuwatch pick -n 2 --allow-busy": [GPUWATCH, "pick", "-n", "2", "--allow-busy"],
        "gpuwatch pick": [GPUWATCH, "pick"],
    }
    if nvisel := tool("nvisel"):
        runs["nvisel -n 2"] = [nvisel, "-n", "2"]
    for number, (name, argv) in enumerate(runs.items()):
        stats = work / f"{number}.stats"
        env = fakenvml_env(library, FAKENVML_STATS=str(stats), GPUWATCH_LEASE_DIR=str(work))
        subprocess.run(argv, env=env, capture_output=True, check=True)
        counts[name] = total_calls(stats)
    print("NVML calls for one selection on 8 GPUs (budget: 7 per GPU + 3 = 59):")
    for name, calls in counts.items():
        print(f"  {name:<40} {calls:4d}")


def concurrent_picks(count: int = 32) -> None:
    work = Path(tempfile.mkdtemp())
    go = work / "go"
    env = {
        "GPUWATCH_SIM": str(count),
        "GPUWATCH_LEASE_DIR": str(work / "leases"),
        "PATH": "/usr/bin:/bin",
    }
    script = f'echo "$CUDA_VISIBLE_DEVICES" > {work}/$$; while [ ! -e {go} ]; do sleep 0.05; done'
    jobs = [
        # --allow-busy: every GPU of the simulated node counts, busy or not
        subprocess.Popen([GPUWATCH, "pick", "--allow-busy", "--", "sh", "-c", script], env=env)
        for _ in range(count)
    ]
    while len(list(work.glob("[0-9]*"))) < count and all(j.poll() is None for j in jobs):
        subprocess.run(["sleep", "0.1"], check=True)
    go.touch()
    codes = [job.wait() for job in jobs]
    chosen = [path.read_text().strip() for path in work.glob("[0-9]*")]
    print(
        f"{count} picks started at once on {count} simulated GPUs: exit codes "
        f"{sorted(set(codes))}, {len(set(chosen))} different GPUs held at the same time"
    )


if __name__ == "__main__":
    library = build_fakenvml()
    startup(library, int(sys.argv[1]) if len(sys.argv) > 1 else 21)
    nvml_calls(library)
    concurrent_picks()
