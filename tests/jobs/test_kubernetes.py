"""Pods as holders: the kubelet engine against a stand-in that speaks the published
podresources/v1 API, with pods on 2 of 4 GPUs and on a MIG device; a kubelet that is slow,
absent or refuses; names that are not text; and `--jobs auto` choosing the kubelet."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs import podresources
from gpuwatch.jobs.engines import open_job_reader
from gpuwatch.jobs.job_table import JobTable, Pod, table_from_record, table_record
from gpuwatch.jobs.kubernetes import KubeletPods
from gpuwatch.jobs.podresources import Deadline, PodResourcesError, read_pod_resources
from gpuwatch.models import Snapshot
from tests.helpers.kubelet import Container, PodSpec, api, gpu_pod, kubelet_stand_in, mig_pod

MIG_NODE = """
[[gpu]]
count = 3
[[gpu]]
model = "A100-80GB"
mig = ["3g.40gb", "1g.10gb"]
"""


@pytest.fixture
def node(tmp_path: Path) -> Snapshot:
    """Four GPUs, the last split into two MIG devices."""
    scenario = tmp_path / "node.toml"
    scenario.write_text(MIG_NODE)
    return SimBackend(scenario).sample()


def pods_of(node: Snapshot) -> list[PodSpec]:
    """Pods on GPUs 1 and 2 (one pod, two GPUs) and on the second MIG device of GPU 3."""
    gpus, migs = node.gpus, node.mig_devices
    return [
        gpu_pod("ml", "train-0", "trainer", str(gpus[1].uuid), str(gpus[2].uuid)),
        mig_pod("serving", "infer-7", "server", "1g.10gb", str(migs[1].uuid)),
        PodSpec("kube-system", "coredns", (Container("coredns"),)),  # holds nothing
    ]


def ask(engine: KubeletPods) -> JobTable | None:
    pending = engine.start()
    assert pending is not None
    pending.join(engine.timeout_s + 5)
    return engine.latest()


def test_the_pods_holding_gpus_are_jobs_holding_them_by_uuid(node: Snapshot) -> None:
    # GIVEN a kubelet with pods on GPUs 1 and 2 and on a MIG device of GPU 3
    with kubelet_stand_in(*pods_of(node)) as kubelet:
        # WHEN its pods are read
        table = ask(KubeletPods(kubelet.socket_path))
    # THEN each container holding NVIDIA devices is a job, named namespace/pod
    assert table is not None
    assert [job.job_id for job in table.jobs] == ["ml/train-0", "serving/infer-7"]
    train, infer = table.jobs
    assert train.pod == Pod("ml", "train-0", "trainer") and train.user is None
    assert infer.holder == "pod serving/infer-7 (container server)"
    # AND the GPUs they hold are theirs, found by UUID; the other devices are free
    holders = [table.job_of_device(device) for device in (*node.gpus, *node.mig_devices)]
    assert holders == [None, train, train, None, None, infer]
    assert set(table.held(node)) == {
        node.gpus[1].uuid,
        node.gpus[2].uuid,
        node.mig_devices[1].uuid,
    }
    # AND the devices that are not NVIDIA's (an FPGA each container also holds) are not
    assert train.device_uuids == (node.gpus[1].uuid, node.gpus[2].uuid)


def test_pods_cross_the_wire_as_jobs_do(node: Snapshot) -> None:
    # GIVEN the pods as the daemon's /v1/jobs writes them
    with kubelet_stand_in(*pods_of(node)) as kubelet:
        table = ask(KubeletPods(kubelet.socket_path))
    assert table is not None
    # WHEN a client reads them back THEN it has the same table
    back = table_from_record(table_record(table))
    assert back == table and back.held(node) == table.held(node)  # type: ignore[union-attr]


def test_gpus_named_by_index_are_found_once_the_gpus_are_known(node: Snapshot) -> None:
    # GIVEN a device plugin naming GPUs by NVML index (its `index` strategy)
    with kubelet_stand_in(gpu_pod("ml", "a", "main", "0", "2")) as kubelet:
        engine = KubeletPods(kubelet.socket_path)
        # WHEN the engine asks before it knows the GPUs THEN it says it lacked them
        before = ask(engine)
        assert before is not None and engine.lacked_gpus()
        # WHEN it is told the GPUs and asks again
        engine.observe(node)
        table = ask(engine)
    # THEN the pod holds GPUs 0 and 2
    assert table is not None and not engine.lacked_gpus()
    assert [table.job_of_gpu(gpu) is not None for gpu in node.gpus] == [True, False, True, False]


def test_names_that_are_not_text_are_made_printable(node: Snapshot) -> None:
    # GIVEN a pod whose names carry terminal escapes (the kubelet's answer is input)
    pod = gpu_pod("ml\x1b[2J", "x\u202ey", "c\n", str(node.gpus[0].uuid))
    with kubelet_stand_in(pod) as kubelet:
        table = ask(KubeletPods(kubelet.socket_path))
    # THEN they come out printable, as every job's text is
    assert table is not None
    (job,) = table.jobs
    assert job.job_id == "ml?[2J/x?y" and job.name == "c?"


def test_a_slow_kubelet_makes_the_pods_unknown_at_the_deadline_and_holds_nothing_up(
    node: Snapshot,
) -> None:
    # GIVEN a kubelet that does not answer
    with kubelet_stand_in(*pods_of(node)) as kubelet:
        kubelet.slow()
        engine = KubeletPods(kubelet.socket_path, timeout_s=0.5)
        # WHEN it is asked THEN asking returns at once, the question on a thread of its own
        began = time.monotonic()
        pending = engine.start()
        assert time.monotonic() - began < 0.5 and pending is not None
        assert engine.start() is pending  # no second question while one is under way
        # AND the question ends at its deadline: pods unknown, and why
        pending.join(10)
        assert not pending.is_alive()
        assert engine.latest() is None
        assert engine.unknown_why() == "the kubelet did not answer within 0.5s"
        kubelet.release()


def test_an_absent_socket_makes_the_pods_unknown_and_says_where(tmp_path: Path) -> None:
    engine = KubeletPods(str(tmp_path / "kubelet.sock"))
    assert ask(engine) is None
    assert engine.unknown_why() == f"no kubelet pod-resources socket at {tmp_path}/kubelet.sock"


def test_a_socket_nobody_listens_on_says_so(tmp_path: Path) -> None:
    # GIVEN a socket file left by a kubelet that is gone
    path = str(tmp_path / "kubelet.sock")
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(path)
        engine = KubeletPods(path, timeout_s=2.0)
        # WHEN it is asked THEN the pods are unknown, and the reason names the socket
        assert ask(engine) is None
    assert engine.unknown_why() == f"nothing answers at {path} (is the kubelet running?)"


def test_a_file_that_is_no_socket_is_not_asked(tmp_path: Path) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    with pytest.raises(PodResourcesError, match="is not a socket"):
        read_pod_resources(str(tmp_path / "kubelet.sock"), Deadline(1.0))


def test_without_grpcio_the_pods_are_unknown_and_the_fix_is_named(
    node: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kubelet_stand_in(*pods_of(node)) as kubelet:
        # GIVEN gpuwatch installed without its kubernetes extra
        monkeypatch.setitem(sys.modules, "grpc", None)
        engine = KubeletPods(kubelet.socket_path)
        # WHEN it is asked THEN the reason says what to install
        assert ask(engine) is None
    assert engine.unknown_why() == "grpcio is not installed (pip install 'gpuwatch[kubernetes]')"


def test_auto_takes_the_kubelet_where_its_socket_is(
    node: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # and no Slurm
    with kubelet_stand_in(*pods_of(node)) as kubelet:
        engine, why = open_job_reader(
            "auto", pod_resources_socket=kubelet.socket_path, timeout_s=1.0
        )
        assert isinstance(engine, KubeletPods) and why is None
    # AND where there is none, auto falls back to Slurm as before (here: none either)
    engine, why = open_job_reader(
        "auto", pod_resources_socket=str(tmp_path / "none.sock"), timeout_s=1.0
    )
    assert engine is None and why is not None and "squeue is not on PATH" in why


def test_kubernetes_insists_even_without_a_socket(tmp_path: Path) -> None:
    # GIVEN --jobs kubernetes where the socket is not (yet) there
    engine, why = open_job_reader(
        "kubernetes", pod_resources_socket=str(tmp_path / "kubelet.sock"), timeout_s=1.0
    )
    # THEN there is an engine, whose pods are unknown with the reason
    assert isinstance(engine, KubeletPods) and why is None
    assert ask(engine) is None and "no kubelet pod-resources socket" in engine.unknown_why()


def test_the_fields_gpuwatch_describes_are_the_published_ones() -> None:
    # GIVEN the messages gpuwatch describes for itself, and the published api.proto as the
    # stand-in compiles it
    messages, _ = api()
    published = messages.DESCRIPTOR.message_types_by_name
    for message, fields in podresources._FIELDS.items():
        # THEN each field has the published number, cardinality and type
        described = published[message].fields_by_name
        for name, number, repeated, type_name in fields:
            field = described[name]
            assert (field.number, field.is_repeated) == (number, repeated), f"{message}.{name}"
            if type_name is None:
                assert field.type == field.TYPE_STRING, f"{message}.{name}"
            else:
                assert field.message_type.name == type_name, f"{message}.{name}"
