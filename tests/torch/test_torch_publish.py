"""Publishing: a watch's reports reach the daemon (`/v1/training`, `/metrics`), and no reader,
slow, stopped or absent, ever holds the training up."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.backends.daemon_client import http_get
from gpuwatch.reports.training import TrainingReport, read_reports
from gpuwatch.torch.publish import Sender, StepQueue, StepRecord
from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.wait import wait_until

pytest.importorskip("torch")

from gpuwatch.torch import SimulatedAllocator, watch

pytestmark = pytest.mark.slow

MiB = 1 << 20


def test_the_daemon_serves_a_watched_training(
    tmp_path: Path, lease_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_daemon(tmp_path) as (_, socket_path, _):
        # GIVEN a training on the daemon's GPU 1, as select() would have set it up
        _, snapshot = get_json(socket_path, "/v1/snapshot")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", snapshot["gpus"][1]["uuid"])
        sim = SimulatedAllocator()
        with watch(source=sim) as memory:
            sim.allocate(300 * MiB)
            memory.step()
            memory.publish_now()
            # WHEN clients ask the daemon
            training = wait_until(
                lambda: get_json(socket_path, "/v1/training")[1]["reports"], "the report"
            )
            metrics = http_get(str(socket_path), "/metrics")[1].decode()
    # THEN /v1/training has the report, with the GPU's NVML index and the user
    (report,) = training
    assert (report["pid"], report["rank"], report["gpu"]) == (os.getpid(), 0, 1)
    assert report["allocated_bytes"] == 300 * MiB
    assert report["user"]
    # AND /metrics has the gpuwatch_torch_* series labelled pid, rank and gpu
    samples = {
        (sample.name, sample.labels["pid"], sample.labels["rank"], sample.labels["gpu"]): sample
        for family in text_string_to_metric_families(metrics)
        if family.name.startswith("gpuwatch_torch_")
        for sample in family.samples
        if "pid" in sample.labels
    }
    key = ("gpuwatch_torch_allocated_bytes", str(os.getpid()), "0", "1")
    assert samples[key].value == 300 * MiB
    assert ("gpuwatch_torch_reserved_bytes", *key[1:]) in samples


def test_a_reader_that_stops_does_not_hold_the_training_up(tmp_path: Path, lease_dir: Path) -> None:
    with running_daemon(tmp_path) as (daemon, socket_path, _):
        sim = SimulatedAllocator()
        with watch(source=sim) as memory:
            memory.step()
            memory.publish_now()
            wait_until(lambda: get_json(socket_path, "/v1/training")[1]["reports"], "a report")
            # GIVEN the reader stops dead (a frozen daemon)
            daemon.send_signal(signal.SIGSTOP)
            try:
                # WHEN the training runs on
                for _ in range(500):
                    memory.step()
                memory.publish_now()
                # THEN every step was taken and published, nothing dropped
                assert memory.steps == 501
                assert memory.dropped == 0
            finally:
                daemon.send_signal(signal.SIGCONT)
            # AND the reader, back, sees the latest step
            wait_until(
                lambda: get_json(socket_path, "/v1/training")[1]["reports"][0]["step"] == 501,
                "the latest step",
            )


def test_with_no_reader_at_all_the_report_waits_for_whoever_comes(lease_dir: Path) -> None:
    with watch(source=SimulatedAllocator()) as memory:
        for _ in range(50):
            memory.step()
        wait_until(lambda: read_reports().reports, "the sender's own publish", timeout_s=60)
        assert memory.steps == 50
    assert read_reports().reports == ()  # closed: the report went with it


def test_a_stuck_sender_costs_dropped_records_not_blocked_steps() -> None:
    # GIVEN a sender stuck writing (a hung file system), and a short queue
    release = threading.Event()
    entered = threading.Event()

    def stuck_build(*args: object) -> TrainingReport:
        entered.set()
        release.wait(60)
        raise OSError("the file system hung")

    queue = StepQueue(length=8)
    sender = Sender(queue, stuck_build, interval_s=0.01)  # type: ignore[arg-type]
    sender.start()
    queue.put(StepRecord(1, 0.1, None))
    entered.wait(60)
    # WHEN the training hands over 100 more steps
    for step in range(2, 102):
        queue.put(StepRecord(step, 0.1, None))
    # THEN every hand-over returned, the oldest were dropped and counted
    assert queue.dropped == 100 - 8
    assert [record.step for record in queue.take_all()] == list(range(94, 102))
    release.set()
    sender.close()


def test_a_lease_directory_that_cannot_be_written_costs_one_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a lease directory that cannot be created (its parent is a file)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("GPUWATCH_LEASE_DIR", str(tmp_path / "a-file" / "leases"))
    # WHEN a watched training publishes again and again
    with watch(source=SimulatedAllocator()) as memory:
        for _ in range(3):
            memory.step()
            memory.publish_now()
    # THEN it trained on, and said why once
    assert memory.steps == 3
    assert capsys.readouterr().err.count("cannot publish reports") == 1
