"""What reading the kubelet's pods costs, and whether the deadline holds: for 100, 10,000 and
100,000 pods (each on one of 8 GPUs by a time-slicing replica's id), through the tests'
kubelet stand-in (pod-resources v1 over gRPC on a Unix socket), the seconds

- the whole question takes (both calls, the stand-in building its answer included, and
  mapping every id to a device), with a deadline that allows it (120 s);
- mapping the decoded answer alone takes (ids to UUIDs, jobs, the table);
- a question with the default 2 s deadline takes, and what it answered.

Run: python bench/kubelet_pods.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuwatch.jobs.kubelet_ids import NodeDevices
from gpuwatch.jobs.kubernetes import DEFAULT_TIMEOUT_S, KubeletPods, pods_table
from gpuwatch.jobs.podresources import Deadline, read_pod_resources
from tests.helpers.kubelet import gpu_pod, kubelet_stand_in


def timed_question(socket_path: str, timeout_s: float) -> tuple[float, str]:
    """Seconds one question of the engine took, and what it answered."""
    engine = KubeletPods(socket_path, timeout_s=timeout_s)
    began = time.monotonic()
    pending = engine.start()
    assert pending is not None
    pending.join(timeout_s + 60)
    table = engine.latest()
    answered = f"{len(table.jobs):,} pods" if table is not None else engine.unknown_why()
    return time.monotonic() - began, answered


def main() -> None:
    print(f"{'pods':>8}  {'question s':>10}  {'mapping s':>9}  {'2s-deadline question':>20}")
    for count in (100, 10_000, 100_000):
        pods = [gpu_pod("ml", f"p-{n}", "main", f"GPU-{n % 8}::{n // 8}") for n in range(count)]
        with kubelet_stand_in(*pods) as kubelet:
            whole_s, _ = timed_question(kubelet.socket_path, 120.0)
            answer = read_pod_resources(kubelet.socket_path, Deadline(120.0))
            began = time.monotonic()
            pods_table(answer, NodeDevices(None), time.time())
            mapping_s = time.monotonic() - began
            short_s, answered = timed_question(kubelet.socket_path, DEFAULT_TIMEOUT_S)
        print(f"{count:>8,}  {whole_s:>10.2f}  {mapping_s:>9.2f}  {short_s:>6.2f} s: {answered}")


if __name__ == "__main__":
    main()
