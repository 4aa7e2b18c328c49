"""A kubelet that cannot be believed makes the pods unknown, and says why in one line, within
the engine's deadline: hung (a gRPC call never answered, a socket that never speaks),
crashed under a call, hanging up, not permitted (a socket another user may not connect
to), an answer over the cap in bytes, containers or devices, and 100,000 pods whose
answer is not read by the deadline. Each against the kubelet stand-in (pod-resources v1
over gRPC) or a socket that is no kubelet."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.jobs import podresources
from gpuwatch.jobs.job_table import JobTable
from gpuwatch.jobs.kubernetes import KubeletPods
from gpuwatch.jobs.podresources import MAX_ANSWER_BYTES
from tests.helpers.kubelet import Kubelet, PodSpec, gpu_pod, kubelet_stand_in, not_a_kubelet
from tests.helpers.other_user import as_user, other_user_ids
from tests.helpers.wait import wait_until


def ask(engine: KubeletPods) -> JobTable | None:
    """The engine's answer, once its question has ended: by its deadline, with a grace for
    the thread to end it."""
    pending = engine.start()
    assert pending is not None
    pending.join(engine.timeout_s + 5)
    assert not pending.is_alive(), "the question outlived its deadline"
    return engine.latest()


class Clock:
    """A monotonic clock a test moves on: real time, plus what it is told to jump."""

    def __init__(self) -> None:
        self.jumped_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.jumped_s

    def jump(self, seconds: float) -> None:
        self.jumped_s += seconds


def test_a_socket_that_never_speaks_makes_the_pods_unknown_at_the_deadline(
    tmp_path: Path,
) -> None:
    # GIVEN a socket that takes the connection and then says nothing
    path = str(tmp_path / "kubelet.sock")
    with not_a_kubelet(path, hang_up=False):
        # WHEN it is asked THEN the pods are unknown at the deadline, and why
        engine = KubeletPods(path, timeout_s=0.5)
        assert ask(engine) is None
    assert engine.unknown_why() == "the kubelet did not answer within 0.5s"


def test_a_socket_that_hangs_up_makes_the_pods_unknown_and_says_so(tmp_path: Path) -> None:
    # GIVEN a socket that closes each connection at once (a relay whose kubelet is gone)
    path = str(tmp_path / "kubelet.sock")
    with not_a_kubelet(path, hang_up=True):
        engine = KubeletPods(path, timeout_s=5.0)
        assert ask(engine) is None
    assert engine.unknown_why() == (
        f"{path} closed the connection without answering (is the kubelet running?)"
    )


def test_a_kubelet_that_crashes_under_the_question_makes_the_pods_unknown() -> None:
    # GIVEN a kubelet that dies while it is being asked
    with kubelet_stand_in(gpu_pod("ml", "a", "main", "GPU-1")) as kubelet:
        kubelet.slow()
        engine = KubeletPods(kubelet.socket_path, timeout_s=30.0)
        pending = engine.start()
        assert pending is not None
        wait_until(lambda: kubelet.calls == 1, "the question to reach the kubelet")
        kubelet.crash()
        # THEN the question ends at once, not at its deadline: the pods unknown, and why
        pending.join(10)
        assert not pending.is_alive()
    assert engine.latest() is None
    assert engine.unknown_why() == (
        f"nothing answers at {kubelet.socket_path} (is the kubelet running?)"
    )


def test_a_kubelet_that_answers_list_and_then_hangs_is_unknown_at_the_one_deadline() -> None:
    # GIVEN a kubelet whose second call (the devices it offers) never answers
    with kubelet_stand_in(gpu_pod("ml", "a", "main", "GPU-1")) as kubelet:
        kubelet.after_list = kubelet.slow
        engine = KubeletPods(kubelet.socket_path, timeout_s=0.5)
        # THEN the whole question ends at its deadline: the pods unknown, and why
        assert ask(engine) is None
        kubelet.release()
    assert engine.unknown_why() == "the kubelet did not answer within 0.5s"


def test_a_socket_this_user_may_not_connect_to_is_named_a_permission_problem() -> None:
    # GIVEN the kubelet's socket, of mode 000, in a folder another user may look into
    uid, gid = other_user_ids()
    with kubelet_stand_in(gpu_pod("ml", "a", "main", "GPU-1"), folder_mode=0o755) as kubelet:
        os.chmod(kubelet.socket_path, 0)
        # WHEN that user's gpuwatch asks it (it sees the socket; connecting is refused)
        script = (
            "from gpuwatch.jobs.kubernetes import KubeletPods\n"
            f"engine = KubeletPods({kubelet.socket_path!r}, timeout_s=5.0)\n"
            "engine.start().join(15)\n"
            "print(engine.latest() is None, engine.unknown_why(), sep='\\n')\n"
        )
        done = subprocess.run(
            as_user(uid, gid, sys.executable, "-c", script),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd="/",
        )
    # THEN the pods are unknown, and the reason names the permission, not a missing kubelet
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True",
        f"{kubelet.socket_path}: permission denied connecting (the kubelet's socket is "
        "root's: run as root, or through a relay that is)",
    ]


def test_an_answer_over_the_cap_is_not_read() -> None:
    # GIVEN a kubelet whose answer is over 16 MiB (a pod name of that many bytes)
    pod = gpu_pod("ml", "x" * (MAX_ANSWER_BYTES + 1), "main", "GPU-1")
    with kubelet_stand_in(pod) as kubelet:
        engine = KubeletPods(kubelet.socket_path, timeout_s=30.0)
        # THEN the pods are unknown, and the reason names the cap
        assert ask(engine) is None
    assert engine.unknown_why() == (
        "the kubelet's answer is over 16 MiB, the most gpuwatch reads (the kubelet's own limit)"
    )


@pytest.mark.parametrize(
    ("cap", "pods", "why"),
    [
        (
            "MAX_CONTAINERS",
            [gpu_pod("ml", f"p{n}", "main", f"GPU-{n}") for n in range(4)],
            "the kubelet lists over 3 containers holding devices, more than gpuwatch reads",
        ),
        (
            "MAX_DEVICES",
            [gpu_pod("ml", "p", "main", "GPU-1", "GPU-2", "GPU-3")],
            "the kubelet lists over 3 devices held, more than gpuwatch reads",
        ),
    ],
    ids=["containers", "devices-held"],
)
def test_an_answer_past_a_cap_is_not_read_at_all(
    monkeypatch: pytest.MonkeyPatch, cap: str, pods: list[PodSpec], why: str
) -> None:
    # GIVEN a cap of 3 (each device-holding container holds the stand-in's FPGA too)
    monkeypatch.setattr(podresources, cap, 3)
    with kubelet_stand_in(*pods) as kubelet:
        # WHEN the kubelet tells more THEN none of it is read: the pods are unknown, and why
        engine = KubeletPods(kubelet.socket_path)
        assert ask(engine) is None
    assert engine.unknown_why() == why


def test_more_devices_offered_than_the_cap_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podresources, "MAX_DEVICES", 3)
    with kubelet_stand_in() as kubelet:
        kubelet.allocatable = {"nvidia.com/gpu": ("GPU-1", "GPU-2", "GPU-3", "GPU-4")}
        engine = KubeletPods(kubelet.socket_path)
        assert ask(engine) is None
    assert engine.unknown_why() == (
        "the kubelet's device plugins offer over 3 devices, more than gpuwatch reads"
    )


# 100,000 pods

MANY = 100_000


@pytest.fixture(scope="module")
def crowded() -> Iterator[Kubelet]:
    """A kubelet with 100,000 pods, each on one of 8 GPUs (time-slicing replicas)."""
    pods = [gpu_pod("ml", f"p-{n}", "main", f"GPU-{n % 8}::{n // 8}") for n in range(MANY)]
    with kubelet_stand_in(*pods) as kubelet:
        yield kubelet


def test_100000_pods_are_read_whole_within_a_deadline_that_allows_it(crowded: Kubelet) -> None:
    engine = KubeletPods(crowded.socket_path, timeout_s=120.0)
    table = ask(engine)
    assert table is not None, engine.unknown_why()
    assert len(table.jobs) == MANY and table.doubts == ()


def test_100000_pods_not_read_by_the_deadline_are_unknown(crowded: Kubelet) -> None:
    # GIVEN the deadline passes while the kubelet's answer of 100,000 pods is being read
    # (the engine's clock jumps past it as the answer leaves the kubelet)
    clock = Clock()
    crowded.after_list = lambda: clock.jump(200.0)
    try:
        engine = KubeletPods(crowded.socket_path, timeout_s=120.0, clock=clock)
        # THEN reading stops there: the pods are unknown, and the reason says how far it got
        assert ask(engine) is None
    finally:
        crowded.after_list = None
    assert engine.unknown_why() == (
        "reading the kubelet's answer (1,024 containers so far) took over 120s"
    )
