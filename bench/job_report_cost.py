"""What `gpuwatch job-report` costs on the largest history the daemon sends: 8 GPUs, 20,000
samples each (the newest 20,000 per GPU: 5.5 h at one a second). Prints the median of 5 runs
of each step: the daemon encoding the answer as JSON, the client parsing and checking it, and
the report summing it up. Run: python bench/job_report_cost.py
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable

import msgspec

from gpuwatch.backends.daemon_client import parse_series
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.reports.job_gpu_report import gpu_job_usage

GPUS, SAMPLES, START_S = 8, 20_000, 1_800_000_000.0


def history() -> dict[str, object]:
    random.seed(0)
    times = [START_S + i for i in range(SAMPLES)]
    series = [
        GpuSeries(
            index,
            f"GPU-{index}",
            times,
            [random.randrange(80 << 30) for _ in times],
            [random.randrange(101) for _ in times],
            [random.randrange(30, 80) for _ in times],
            [random.uniform(60, 700) for _ in times],
        )
        for index in range(GPUS)
    ]
    return {
        "interval_s": 1.0,
        "truncated": False,
        "gpus": [msgspec.structs.asdict(s) for s in series],
    }


def median_ms(step: Callable[[], object]) -> float:
    runs = []
    for _ in range(5):
        began = time.perf_counter()
        step()
        runs.append((time.perf_counter() - began) * 1000)
    return statistics.median(runs)


def main() -> None:
    answer = history()
    body = json.dumps(answer)
    parsed = [s for item in json.loads(body)["gpus"] if (s := parse_series(item)) is not None]
    end_s = START_S + SAMPLES
    steps: dict[str, Callable[[], object]] = {
        "daemon: encode the answer (json.dumps)": lambda: json.dumps(answer),
        "client: json.loads": lambda: json.loads(body),
        "client: json.loads + parse_series": lambda: [
            parse_series(item) for item in json.loads(body)["gpus"]
        ],
        "report: gpu_job_usage, 8 GPUs": lambda: [gpu_job_usage(s, START_S, end_s) for s in parsed],
    }
    print(f"{GPUS} GPUs x {SAMPLES:,} samples, answer {len(body) / 2**20:.1f} MiB")
    for name, step in steps.items():
        print(f"  {name:45s} {median_ms(step):8.1f} ms")


if __name__ == "__main__":
    main()
