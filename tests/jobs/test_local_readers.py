"""`gpuwatch status` and the TUI without a daemon ask this node's job engine through the one
engine interface, and hand it the GPUs they read: on a gres.conf with `AutoDetect=nvml` and
`File=` lines (slurmd numbers the GPUs in NVML's order) the jobs are known, not "unknown".
Slurm is played by the stand-ins of tests/helpers/slurm_stand_in.py; a kubelet by its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.sampling.node_jobs import EngineReader, jobs_reader
from tests.helpers.cli import run_cli, under
from tests.helpers.kubelet import gpu_pod, kubelet_stand_in
from tests.helpers.slurm_stand_in import NODE, SlurmNode, make_slurm_node

# slurmd numbers these in NVML's order: GRES 0-3 are NVML 0-3 (minors 4-7).
AUTODETECT = "AutoDetect=nvml\nNodeName=vm Name=gpu File=/dev/nvidia[4-7]\n"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmNode:
    slurm = make_slurm_node(tmp_path / "slurm")
    (slurm.root / "gres.conf").write_text(AUTODETECT)
    slurm.apply(monkeypatch)
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(slurm.root / "run"))  # no daemon socket there
    return slurm


def test_status_without_a_daemon_knows_the_jobs_of_an_autodetect_node(node: SlurmNode) -> None:
    # WHEN status reads the GPUs itself, and asks Slurm itself
    result = run_cli("status", "--sim", str(NODE))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    # THEN each job is under the GPUs slurmd gave it, in NVML's order (job 1: GRES 0-1)
    assert "jobs unknown" not in result.stdout
    assert [under(lines, i)[0].split()[:2] for i in (0, 1, 2)] == [["job", "1"]] * 2 + [
        ["job", "2"]
    ]
    assert under(lines, 3) == []


def test_the_screens_reader_without_a_daemon_knows_them_too(node: SlurmNode) -> None:
    # GIVEN the reader the TUI asks on each frame, over the node's GPUs
    backend = SimBackend(NODE)
    reader = jobs_reader(backend, one_shot=False)
    assert isinstance(reader, EngineReader)
    try:
        # WHEN a frame is read as the TUI reads it: ask, read the GPUs, hand them over, read
        reader.start()
        snapshot = backend.sample()
        reader.observe(snapshot)
        jobs = reader.read()
    finally:
        reader.close()
    # THEN the jobs are known, on NVML's order
    assert jobs.unknown_why is None
    assert [getattr(jobs.job_of(gpu), "job_id", None) for gpu in snapshot.gpus] == [
        "1",
        "1",
        "2",
        None,
    ]


def test_status_of_a_kubernetes_node_without_a_daemon_asks_the_kubelet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a node whose kubelet says a pod holds GPU 2 (status run as root, who sees its
    # socket; here the stand-in's, named as a container would name the host's)
    gpus = SimBackend(NODE).sample().gpus
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    with kubelet_stand_in(gpu_pod("ml", "train-0", "main", str(gpus[2].uuid))) as kubelet:
        monkeypatch.setenv("GPUWATCH_KUBELET_SOCKET", kubelet.socket_path)
        result = run_cli("status", "--sim", str(NODE))
    # THEN the pod is shown under the GPU it holds
    assert result.exit_code == 0, result.stderr
    assert under(result.stdout.splitlines(), 2)[0].startswith("  pod ml/train-0 (container main)")


def test_pick_without_a_daemon_takes_no_gpu_while_the_kubelet_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a Kubernetes node whose kubelet does not answer (its pods unknown), no daemon
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.delenv("GPUWATCH_SOCKET", raising=False)
    with kubelet_stand_in() as kubelet:
        kubelet.slow()
        monkeypatch.setenv("GPUWATCH_KUBELET_SOCKET", kubelet.socket_path)
        # WHEN pick asks for one GPU of any use, then takes unknown holders
        refused = run_cli("pick", "--sim", str(NODE), "--allow-busy")
        taken = run_cli("pick", "--sim", str(NODE), "--allow-busy", "--allow-unknown-holders")
        kubelet.release()
    # THEN it first takes none, in one line saying why and what would take one
    assert refused.exit_code == 4, refused.stderr
    first = refused.stderr.splitlines()[0]
    assert "who holds them is unknown" in first and "kubelet did not answer" in first
    assert "--allow-unknown-holders" in first
    # AND then takes one, as told
    assert taken.exit_code == 0, taken.stderr
