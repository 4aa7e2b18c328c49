"""A Kubernetes node for the tests of pods holding GPUs: its simulated GPUs (three whole,
one split into two MIG devices, nothing running) and the pods its kubelet stand-in tells,
the UUIDs matching."""

from __future__ import annotations

from gpuwatch.models import Snapshot
from tests.helpers.kubelet import PodSpec, gpu_pod, mig_pod

NODE = """
hostname = "k8s-gpu-3"
[[gpu]]
count = 3
load = "constant"
utilization_pct = 0
[[gpu]]
model = "A100-80GB"
mig = ["3g.40gb", "1g.10gb"]
load = "constant"
utilization_pct = 0
"""
"""Four idle GPUs, the last split into MIG devices; no process anywhere (a --sim scenario)."""


def node_pods(node: Snapshot) -> tuple[PodSpec, ...]:
    """Pod ml/train-0 (container trainer) on GPUs 1 and 2, pod serving/infer-7 (container
    server) on GPU 3's second MIG device: of `node`, the scenario's GPUs as sampled."""
    gpus, migs = node.gpus, node.mig_devices
    return (
        gpu_pod("ml", "train-0", "trainer", str(gpus[1].uuid), str(gpus[2].uuid)),
        mig_pod("serving", "infer-7", "server", "1g.10gb", str(migs[1].uuid)),
    )
