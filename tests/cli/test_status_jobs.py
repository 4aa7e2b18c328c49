"""`gpuwatch status` on a Slurm node: the job under each GPU it holds, "jobs unknown" when
Slurm does not answer, nothing on a machine without Slurm; the same in `--json`.

Slurm is played by stand-in scripts printing recorded answers (tests/helpers/slurm_stand_in.py);
tests/jobs/test_status_real_slurm.py runs the same against a real Slurm.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.jobs.job_table import Job, JobTable, Pod, table_record
from gpuwatch.models import SNAPSHOT_FORMAT_VERSION
from gpuwatch.sampling.jobs_cache import FILE_NAME, FORMAT, slurm_key
from tests.helpers.cli import CliResult, run_cli, under
from tests.helpers.slurm_stand_in import (
    NODE,
    SlurmNode,
    fake_daemon,
    make_slurm_node,
    recorded_squeue,
)
from tests.helpers.wait import wait_until


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmNode:
    slurm = make_slurm_node(tmp_path / "slurm")
    slurm.apply(monkeypatch)
    return slurm


def status(*args: str) -> CliResult:
    result = run_cli("status", "--sim", str(NODE), *args)
    assert result.exit_code == 0, result.stderr
    return result


def test_each_gpu_a_job_holds_shows_the_job_under_it(node: SlurmNode) -> None:
    # GIVEN Slurm running job 1 on GRES 0-1 (NVML 3 and 1) and job 2 on GRES 2 (NVML 2)
    # WHEN status is shown
    lines = status().stdout.splitlines()
    # THEN each held GPU has its job's line under it, with the time left; GPU 0 has none
    assert under(lines, 0) == []
    for index in (1, 3):
        (line,) = under(lines, index)
        assert re.fullmatch(r"  job 1 root  train  1:\d\d:\d\d left", line), line
    assert under(lines, 2) == ["  job 2 root  eval  no time limit"]
    assert "jobs unknown" not in "\n".join(lines)


@pytest.mark.parametrize("columns", [80, 40], ids=["80-columns", "40-columns"])
def test_narrow_terminals_keep_every_line_within_the_width(
    node: SlurmNode, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    # GIVEN a narrow terminal
    monkeypatch.setenv("COLUMNS", str(columns))
    # WHEN status is shown
    lines = status().stdout.splitlines()
    # THEN no line is wider, and each held GPU still names its job
    assert max(len(line) for line in lines) <= columns
    assert under(lines, 3)[0].startswith("  job 1 root")


def test_json_lists_the_jobs_with_their_gpus_as_nvml_indices(node: SlurmNode) -> None:
    # WHEN status is asked for JSON
    data = json.loads(status("--json").stdout)
    # THEN the jobs are listed with this node's NVML indices and UUIDs, and each GPU says
    # which job holds it
    jobs = {job["job_id"]: job for job in data["jobs"]}
    uuids = {gpu["index"]: gpu["uuid"] for gpu in data["gpus"]}
    assert jobs["1"]["gpus"] == [1, 3] and jobs["1"]["gpu_uuids"] == [uuids[1], uuids[3]]
    assert (jobs["1"]["user"], jobs["1"]["name"], jobs["1"]["time_limit_s"]) == (
        "root",
        "train",
        5400.0,
    )
    assert jobs["2"]["gpus"] == [2] and jobs["2"]["time_limit_s"] is None
    assert jobs["3"]["gpus"] == []
    assert isinstance(jobs["1"]["started_at"], float)
    assert [gpu["job_id"] for gpu in data["gpus"]] == [None, "1", "2", "1"]
    assert [gpu["allocated_idle_s"] for gpu in data["gpus"]] == [None] * 4
    assert data["jobs_error"] is None


def test_a_hung_squeue_is_given_up_on_and_killed(node: SlurmNode) -> None:
    # GIVEN a squeue that never answers
    node.squeue("exec sleep 600")
    # WHEN status is shown, once as a table and once as JSON
    first = status()
    # THEN the GPUs are shown, with one line saying why the jobs are unknown
    assert "jobs unknown: Slurm did not answer within 1s" in first.stdout.splitlines()[1]
    assert "[3] " in first.stdout
    # AND the squeue it started is not left running
    pid = int((node.root / "squeue-pid").read_text())
    wait_until(lambda: not _alive(pid), "the hung squeue was left running")
    # AND the next status, seconds later, does not wait for Slurm again
    data = json.loads(status("--json").stdout)
    assert data["jobs"] is None and "did not answer" in data["jobs_error"]
    assert node.calls == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("this is not json", "squeue --json printed no JSON"),
        ('{"jobs": [], "errors": ["Unable to contact slurm controller"]}', "reported errors"),
        ('{"nodes": []}', "printed no `jobs` list"),
    ],
    ids=["not-json", "errors", "no-jobs-list"],
)
def test_a_garbled_answer_says_jobs_unknown_and_why(node: SlurmNode, answer: str, why: str) -> None:
    # GIVEN a squeue that prints something other than a job list
    node.squeue_prints(answer)
    # WHEN status is shown
    result = status()
    # THEN the jobs are unknown, saying why, and the GPUs are shown as ever
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("jobs unknown")]
    assert why in line
    assert not [line for line in result.stdout.splitlines() if line.startswith("  job ")]


def test_without_squeue_nothing_is_said_about_jobs(
    node: SlurmNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no squeue on the PATH (a laptop)
    (node.root / "bin" / "squeue").unlink()
    monkeypatch.setenv("PATH", str(node.root / "bin"))
    # WHEN status is shown, as a table and as JSON
    text, data = status().stdout, json.loads(status("--json").stdout)
    # THEN not a word about jobs: no job lines, no "jobs unknown"
    assert "job" not in text
    assert (data["jobs"], data["jobs_error"]) == (None, None)


def test_squeue_without_a_slurm_configuration_is_not_a_slurm_node(
    node: SlurmNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN squeue installed, but no slurm.conf (a client package installed for nothing)
    if any(Path(p).exists() for p in ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")):
        pytest.skip("this machine has a Slurm configuration")
    monkeypatch.delenv("SLURM_CONF")
    # WHEN status is shown
    text = status().stdout
    # THEN nothing is said about jobs, and squeue was not run
    assert "job" not in text and node.calls == 0


def test_no_jobs_asks_no_scheduler(node: SlurmNode) -> None:
    # WHEN status is shown with --no-jobs
    text = status("--no-jobs").stdout
    # THEN squeue is not run and no job is shown
    assert node.calls == 0 and "job" not in text


def test_status_run_again_within_seconds_asks_slurm_once(node: SlurmNode) -> None:
    # WHEN status is shown three times in a row
    outputs = [status().stdout for _ in range(3)]
    # THEN Slurm was asked once, and each showed the jobs
    assert node.calls == 1
    assert all("  job 2 root  eval" in output for output in outputs)


def planted(table: JobTable, **changes: object) -> dict[str, object]:
    record: dict[str, object] = {
        "format": FORMAT,
        "key": slurm_key(),
        "written_at": time.time(),
        "jobs": table_record(table),
    }
    record.update(changes)
    return record


FAKE = JobTable((Job("999", "mallory", "fake", (4, 5, 6, 7), None, None),), time.time())


@pytest.mark.parametrize(
    ("mode", "changes"),
    [
        (0o666, {}),
        (0o600, {"key": "another slurm"}),
        (0o600, {"written_at": time.time() - 3600}),
        (0o600, {"written_at": time.time() + 3600}),
        (0o600, {"jobs": {"known": True, "read_at": 1.0, "source": "x", "jobs": [{}]}}),
        (0o600, {"format": 99}),
    ],
    ids=["others-may-write", "other-slurm", "old", "future", "malformed", "format"],
)
def test_a_cache_file_that_cannot_be_believed_is_ignored(
    node: SlurmNode, mode: int, changes: dict[str, object]
) -> None:
    # GIVEN a cache file saying job 999 holds every GPU, that cannot be believed
    path = Path(node.env["XDG_RUNTIME_DIR"]) / FILE_NAME
    path.write_text(json.dumps(planted(FAKE, **changes)))
    path.chmod(mode)
    # WHEN status is shown
    text = status().stdout
    # THEN Slurm is asked, and its answer shown
    assert "999" not in text and "  job 2 root  eval" in text
    assert node.calls == 1


def test_a_cache_file_behind_a_symlink_is_ignored(node: SlurmNode, tmp_path: Path) -> None:
    # GIVEN the cache's name a symlink to a believable record elsewhere
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(planted(FAKE)))
    elsewhere.chmod(0o600)
    (Path(node.env["XDG_RUNTIME_DIR"]) / FILE_NAME).symlink_to(elsewhere)
    # WHEN status is shown
    text = status().stdout
    # THEN it is not followed
    assert "999" not in text and "  job 2 root  eval" in text


def test_a_believable_cache_file_is_used(node: SlurmNode) -> None:
    # GIVEN this user's own fresh cache file (as another status wrote it)
    path = Path(node.env["XDG_RUNTIME_DIR"]) / FILE_NAME
    path.write_text(json.dumps(planted(FAKE)))
    path.chmod(0o600)
    # WHEN status is shown
    text = status().stdout
    # THEN its jobs are shown, and Slurm is not asked
    assert "  job 999 mallory  fake" in text and node.calls == 0


# --- through the daemon -------------------------------------------------------------------


def daemon_routes(jobs: tuple[int, object]) -> dict[str, tuple[int, object]]:
    snapshot = SimBackend(NODE).sample().to_dict()
    snapshot["format_version"] = SNAPSHOT_FORMAT_VERSION
    return {"/v1/snapshot": (200, snapshot), "/v1/jobs": jobs}


def test_the_daemons_jobs_and_idle_times_are_shown(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a daemon that says job 7 holds NVML GPUs 0 and 1, GPU 1 idle for 20 minutes
    table = JobTable((Job("7", "alice", "train-llm", (4, 5), time.time() - 60, 7200.0),), 1.0)
    uuids = [gpu.uuid for gpu in SimBackend(NODE).sample().gpus]
    record = {**table_record(table), "allocated_idle_s": {uuids[1]: 1200.0, uuids[0]: 30.0}}
    record["idle_window_s"] = 600.0
    socket_path = tmp_path / "daemon.sock"
    monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
    with fake_daemon(socket_path, daemon_routes((200, record))):
        # WHEN status reads the daemon, as a table and as JSON
        lines = run_cli("status").stdout.splitlines()
        data = json.loads(run_cli("status", "--json").stdout)
    # THEN both GPUs show the job, and only GPU 1 is marked allocated and idle
    assert re.fullmatch(r"  job 7 alice  train-llm  1:5\d:\d\d left", under(lines, 0)[0])
    assert re.fullmatch(r"  job 7 alice .* left  allocated, idle 20m", under(lines, 1)[0])
    assert [gpu["job_id"] for gpu in data["gpus"]] == ["7", "7", None, None]
    assert [gpu["allocated_idle_s"] for gpu in data["gpus"]] == [30.0, 1200.0, None, None]
    assert data["allocated_idle_window_s"] == 600.0
    # AND Slurm was not asked here: the daemon did
    assert node.calls == 0


def test_a_gpu_a_kubernetes_pod_holds_shows_the_pod_under_it(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a daemon that says container "trainer" of pod ml/train-0 holds NVML GPU 0
    uuids = [gpu.uuid or "" for gpu in SimBackend(NODE).sample().gpus]
    pod = Pod("ml", "train-0", "trainer")
    job = Job("ml/train-0", None, "trainer", (), None, None, device_uuids=(uuids[0],), pod=pod)
    record = table_record(JobTable((job,), 1.0))
    socket_path = tmp_path / "daemon.sock"
    monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
    with fake_daemon(socket_path, daemon_routes((200, record))):
        # WHEN status reads the daemon
        lines = run_cli("status").stdout.splitlines()
    # THEN GPU 0's line names the pod and its container, as the node screen does
    assert under(lines, 0) == ["  pod ml/train-0 (container trainer)"]
    assert under(lines, 1) == []


def test_a_daemon_without_the_jobs_route_leaves_slurm_to_status(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an older daemon (404 for /v1/jobs)
    socket_path = tmp_path / "daemon.sock"
    monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
    with fake_daemon(socket_path, daemon_routes((404, {"error": "no such path"}))):
        # WHEN status reads it
        text = run_cli("status").stdout
    # THEN the jobs come from this node's Slurm
    assert "  job 2 root  eval" in text and node.calls == 1


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"known": True, "jobs": "everything"}),
        (200, [1, 2]),
        (500, {"error": "boom"}),
    ],
    ids=["malformed", "not-an-object", "error"],
)
def test_a_daemon_answer_that_cannot_be_believed_says_jobs_unknown(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: tuple[int, object]
) -> None:
    socket_path = tmp_path / "daemon.sock"
    monkeypatch.setenv("GPUWATCH_SOCKET", str(socket_path))
    # GIVEN a daemon whose jobs answer is garbled
    with fake_daemon(socket_path, daemon_routes(answer)):
        # WHEN status reads it
        result = run_cli("status")
    # THEN the GPUs are shown, and the jobs unknown, saying it was the daemon
    assert result.exit_code == 0
    assert "jobs unknown: the daemon" in result.stdout


@pytest.mark.slow
def test_through_a_real_daemon_the_jobs_are_shown(
    node: SlurmNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a real daemon on the Slurm node (its /v1/jobs, or none: status asks Slurm),
    # once it has read the jobs (its first read of Slurm may come after its first sample)
    from tests.helpers.daemon import get_json, running_daemon
    from tests.helpers.wait import wait_until

    (tmp_path / "daemon").mkdir()
    scenario = NODE.read_text()
    with running_daemon(tmp_path / "daemon", env=node.env, scenario=scenario) as (_, sock, _):
        wait_until(lambda: get_json(sock, "/v1/jobs")[1].get("jobs"), "the daemon's jobs")
        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        # WHEN status reads it
        result = run_cli("status", "-v")
    # THEN it read the daemon, and each held GPU names its job
    assert "reading GPUs from the daemon" in result.stderr
    lines = result.stdout.splitlines()
    assert under(lines, 2) == ["  job 2 root  eval  no time limit"]
    assert under(lines, 0) == []


def test_a_job_that_cannot_be_believed_leaves_its_gpus_unknown_and_the_rest_shown(
    node: SlurmNode,
) -> None:
    # GIVEN Slurm's answer with job 1 (GRES 0-1: NVML 3 and 1) given a 250-character user
    data = json.loads(recorded_squeue())
    first = next(job for job in data["jobs"] if job["job_id"] == 1)
    first["user_name"] = "u" * 250
    node.squeue_prints(json.dumps(data))
    # WHEN status is shown, as a table and as JSON
    lines = status().stdout.splitlines()
    document = json.loads(status("--json").stdout)
    # THEN job 1's GPUs say their holders are unknown, job 2 is shown, the jobs known
    for index in (1, 3):
        assert under(lines, index)[0].startswith("  holders unknown: job 1: user not text")
    assert under(lines, 2) == ["  job 2 root  eval  no time limit"]
    assert not [line for line in lines if line.startswith("jobs unknown")]
    unknown = [gpu["holders_unknown"] is not None for gpu in document["gpus"]]
    assert unknown == [False, True, False, True]
    # AND pick, asked for the idle GPUs, takes neither (nor job 2's)
    picked = run_cli("pick", "--sim", str(NODE), "-n", "2")
    assert picked.exit_code == 4, picked.stderr
    assert "GPU 1: holders unknown: job 1: user not text" in picked.stderr
