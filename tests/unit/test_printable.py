"""Text from elsewhere is made printable once, where it enters the model: the one
`printable()`, and every text field of every value of the model and the jobs' table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuwatch.backends.daemon_client import DaemonBackend
from gpuwatch.errors import DaemonUnavailableError
from gpuwatch.fleet_model import FleetState, GpuJob, NodeState, NodeSummary
from gpuwatch.jobs.job_table import Job, JobTable, NodeJobs
from gpuwatch.models import GpuSample, Lease, MigDevice, ProcessKind, ProcessUsage, Snapshot
from gpuwatch.text import printable
from tests.helpers.daemon import answering_once

SEQUENCES = {
    "osc-title": "\x1b]0;PWNED\x1b\\",
    "osc-clipboard": "\x1b]52;c;cHduZWQ=\x07",
    "csi": "\x1b[2J\x1b[999;999H",
    "c1-csi": "\x9b31m",
    "c1-osc": "\x9d0;PWNED\x9c",
    "lone-esc": "\x1b",
    "bel": "\x07",
    "del": "\x7f",
    "bidi-override": "\u202e",
    "zero-width-space": "\u200b",
    "line-separator": "\u2028",
    "newline": "\n",
    "nul": "\x00",
    "undecodable-byte": "\udcff",
}


@pytest.mark.parametrize("sequence", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_every_character_a_terminal_acts_on_becomes_a_question_mark(sequence: str) -> None:
    # GIVEN text around a sequence a terminal would act on WHEN made printable
    shown = printable(f"GPU {sequence} name")
    # THEN nothing in it acts, its printable rest stays, and a `?` marks each character
    assert shown.isprintable()
    assert shown.startswith("GPU ") and shown.endswith(" name")
    assert shown.count("?") == sum(not ch.isprintable() for ch in sequence)


def test_printable_text_is_kept_as_it_is() -> None:
    text = "NVIDIA H100 80GB HBM3 · Grüße 東京 [bold]x[/bold]"
    assert printable(text) is text


HOSTILE = "x" + "".join(SEQUENCES.values())
# Each value of the model with one text field set to HOSTILE, by (value, field).
MAKERS: dict[str, Callable[[str], Any]] = {
    "gpu.uuid": lambda t: GpuSample(0, t, "H100", "0000:18:00.0"),
    "gpu.name": lambda t: GpuSample(0, "GPU-1", t, "0000:18:00.0"),
    "gpu.pci_bus_id": lambda t: GpuSample(0, "GPU-1", "H100", t),
    "gpu.error": lambda t: GpuSample(0, "GPU-1", "H100", None, error=t),
    "mig.uuid": lambda t: MigDevice(0, 1, t),
    "mig.name": lambda t: MigDevice(0, 1, "MIG-1", name=t),
    "mig.profile": lambda t: MigDevice(0, 1, "MIG-1", profile=t),
    "mig.error": lambda t: MigDevice(0, 1, "MIG-1", error=t),
    "process.gpu_uuid": lambda t: _process(gpu_uuid=t),
    "process.user": lambda t: _process(user=t),
    "process.command": lambda t: _process(command=t),
    "process.mig_uuid": lambda t: _process(mig_uuid=t),
    "lease.gpu_uuid": lambda t: Lease(t, 0, 1, "alice", "python", 1.0),
    "lease.user": lambda t: Lease("GPU-1", 0, 1, t, "python", 1.0),
    "lease.command": lambda t: Lease("GPU-1", 0, 1, "alice", t, 1.0),
    "lease.lease_id": lambda t: Lease("GPU-1", 0, 1, "alice", "python", 1.0, lease_id=t),
    "snapshot.hostname": lambda t: Snapshot(1.0, t, "580", "13.0", (), ()),
    "snapshot.driver_version": lambda t: Snapshot(1.0, "node", t, "13.0", (), ()),
    "snapshot.cuda_driver_version": lambda t: Snapshot(1.0, "node", "580", t, (), ()),
    "gpu-job.job_id": lambda t: GpuJob(0, t, "alice"),
    "gpu-job.user": lambda t: GpuJob(0, "42", t),
    "node.name": lambda t: NodeState(t, up=False, snapshot=None),
    "node.error": lambda t: NodeState("node", up=False, snapshot=None, error=t),
    "fleet.source": lambda t: FleetState(1.0, t, ()),
    "job.job_id": lambda t: Job(t, "alice", "train", (0,), None, None),
    "job.user": lambda t: Job("42", t, "train", (0,), None, None),
    "job.name": lambda t: Job("42", "alice", t, (0,), None, None),
    "job.state": lambda t: Job("42", "alice", "train", (0,), None, None, state=t),
    "job-table.source": lambda t: JobTable((), 1.0, source=t),
    "node-jobs.unknown_why": lambda t: NodeJobs(None, t, scheduler=True),
}


def _process(**text: str) -> ProcessUsage:
    fields: dict[str, Any] = {"gpu_uuid": "GPU-1", "user": "alice", "command": "python", **text}
    return ProcessUsage(1, 0, memory_used_bytes=1, kind=ProcessKind.COMPUTE, **fields)


@pytest.mark.parametrize("made", MAKERS.values(), ids=MAKERS.keys())
def test_each_text_field_of_the_model_is_printable_once_made(made: Callable[[str], Any]) -> None:
    # GIVEN a value made with escape sequences in one of its text fields
    value = made(HOSTILE)
    # WHEN its fields are read (by a screen, JSON, a metric label)
    texts = [text for text in _texts(value) if isinstance(text, str) and text.startswith("x")]
    # THEN the field holds the text made printable, and so does a copy of the value
    assert texts == [printable(HOSTILE)]
    assert texts[0].isprintable()


def _texts(value: Any) -> list[str]:
    return [getattr(value, name) for name in value.__struct_fields__ if not name.startswith("_")]


def test_a_nodes_figures_name_users_and_models_printably() -> None:
    # GIVEN a node's figures from Prometheus naming a user and a GPU model with escapes
    summary = NodeSummary(
        1, 1, None, None, None, None, None, None, None, users=((HOSTILE, 1, 2),), models=(HOSTILE,)
    )
    # THEN both are printable, the figures beside them kept
    assert summary.users == ((printable(HOSTILE), 1, 2),)
    assert summary.models == (printable(HOSTILE),)


def test_text_that_is_not_text_is_refused_where_it_enters() -> None:
    with pytest.raises(TypeError, match="name: int, not text"):
        GpuSample(0, "GPU-1", 5, None)  # type: ignore[arg-type]


def test_a_daemons_answer_with_escapes_is_read_printable(tmp_path: Any) -> None:
    # GIVEN a daemon (or one planted in its place) whose snapshot's texts carry escapes
    snapshot = Snapshot(
        1.0, "node", "580", "13.0", (GpuSample(0, "GPU-1", "H100", None),), ()
    ).to_dict()
    snapshot |= {"taken_at": _now(), "hostname": HOSTILE, "driver_version": HOSTILE}
    snapshot["gpus"][0]["name"] = HOSTILE
    path = str(tmp_path / "d.sock")
    with answering_once(path, json.dumps(snapshot).encode()):
        # WHEN a client reads it THEN every text it holds is printable
        read = DaemonBackend(path).sample()
    assert read.hostname == read.driver_version == read.gpus[0].name == printable(HOSTILE)


def test_a_daemons_answer_with_a_number_for_a_name_is_a_failing_daemon(tmp_path: Any) -> None:
    snapshot = Snapshot(1.0, "node", "580", "13.0", (), ()).to_dict()
    snapshot |= {"taken_at": _now(), "hostname": 7}
    path = str(tmp_path / "d.sock")
    answer = json.dumps(snapshot).encode()
    with answering_once(path, answer), pytest.raises(DaemonUnavailableError, match="int, not"):
        DaemonBackend(path)


def _now() -> float:
    return time.time()
