"""A Slurm node for the display tests without a Slurm: stand-in `squeue` and `scontrol`
scripts on the PATH printing recorded answers (tests/jobs/data), a gres.conf naming the
node's GPU files out of index order, and a fake daemon that serves chosen routes.

The node is tests/jobs/data/slurm-node.toml: NVML indices 0-3 have minor numbers 4-7, and
gres.conf lists nvidia7, nvidia5, nvidia6, nvidia4, so GRES index 0 is NVML index 3.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "jobs" / "data"
NODE = DATA / "slurm-node.toml"
RECORDED = DATA / "squeue-22.05.json"


def recorded_squeue(started_ago_s: float = 600.0) -> str:
    """The recorded `squeue --json` (node `vm`: job 1 `train` on GRES 0-1 with 90 min,
    job 2 `eval` on GRES 2 without a limit, job 3 on no GPU), started `started_ago_s` ago."""
    data = json.loads(RECORDED.read_text())
    for job in data["jobs"]:
        if job["job_state"] == "RUNNING":
            job["start_time"] = int(time.time() - started_ago_s)
    return json.dumps(data)


def many_jobs(count: int, started_ago_s: float = 600.0) -> str:
    """`squeue --json` of `count` running jobs on node `vm`, the first four holding one GPU
    each, in the shape of the recorded answer (a node busy with small jobs)."""
    data = json.loads(RECORDED.read_text())
    model = data["jobs"][0]
    jobs = []
    for number in range(1, count + 1):
        job = json.loads(json.dumps(model))
        job.update(job_id=number, name=f"job-{number}", user_name=f"user{number % 7}")
        job["start_time"] = int(time.time() - started_ago_s)
        job["gres_detail"] = [f"gpu:1(IDX:{number - 1})"] if number <= 4 else []
        jobs.append(job)
    data["jobs"] = jobs
    return json.dumps(data)


@dataclass
class SlurmNode:
    """Where the stand-ins live, and the environment that makes gpuwatch use them."""

    root: Path
    env: dict[str, str]

    @property
    def calls(self) -> int:
        """How many times squeue was run."""
        path = self.root / "squeue-calls"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def squeue(self, script: str) -> None:
        """squeue runs `script` (sh), after counting the call and writing its pid."""
        body = f'echo $$ >> "{self.root}/squeue-calls"\necho $$ > "{self.root}/squeue-pid"\n'
        _executable(self.root / "bin" / "squeue", f"#!/bin/sh\n{body}{script}\n")

    def squeue_prints(self, text: str) -> None:
        (self.root / "answer.json").write_text(text)
        self.squeue(f'cat "{self.root}/answer.json"')

    def apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)


def make_slurm_node(root: Path, base_env: Mapping[str, str] | None = None) -> SlurmNode:
    """A node `vm` whose squeue prints the recorded answer; scontrol fails."""
    (root / "bin").mkdir(parents=True)
    run = root / "run"
    run.mkdir(mode=0o700)
    (root / "slurm.conf").write_text("# the stand-ins read nothing here\n")
    (root / "gres.conf").write_text(
        f"NodeName=vm Name=gpu File={root}/dev/nvidia[7,5,6,4]\nNodeName=other Name=gpu\n"
    )
    _executable(root / "bin" / "scontrol", "#!/bin/sh\nexit 1\n")
    base = dict(os.environ if base_env is None else base_env)
    env = {
        "PATH": f"{root / 'bin'}{os.pathsep}{base.get('PATH', '')}",
        "SLURM_CONF": str(root / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
        "XDG_RUNTIME_DIR": str(run),
    }
    node = SlurmNode(root, env)
    node.squeue_prints(recorded_squeue())
    return node


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@contextmanager
def fake_daemon(path: Path, routes: Mapping[str, tuple[int, object]]) -> Iterator[None]:
    """A stand-in daemon at `path` answering GETs of `routes` ({path: (status, JSON)}), and
    404 elsewhere, until the block ends."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                request = connection.recv(4096).decode("latin-1")
                route = request.split(" ")[1].split("?")[0] if " " in request else ""
                status, data = routes.get(route, (404, {"error": "no such path"}))
                body = json.dumps(data).encode()
                head = f"HTTP/1.0 {status} X\r\nContent-Length: {len(body)}\r\n\r\n"
                connection.sendall(head.encode() + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        server.close()
