"""The job reader's bounds against a real Slurm (Debian's slurm-wlm 22.05): the real
`squeue` and `scontrol` behind wrappers that misbehave as a site's wrapper or a broken
answer could, each reader ending within its deadline with a one-line reason, and nothing
left running."""

from __future__ import annotations

import shutil
import sys
import uuid
from pathlib import Path

import pytest

from gpuwatch.jobs import SlurmJobs
from gpuwatch.jobs.slurm import MAX_OUTPUT_BYTES
from tests.helpers.slurm import READ_TIMEOUT_S, SlurmCluster, gpu_job
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.slow  # a real slurmctld and slurmd


def wrapped(cluster: SlurmCluster, folder: Path, name: str, body: str) -> dict[str, str]:
    """The cluster's environment with `name` replaced by a wrapper running `body` (sh),
    where `$REAL` is the real command."""
    real = shutil.which(name, path=cluster.env["PATH"])
    assert real is not None
    folder.mkdir(exist_ok=True)
    wrapper = folder / name
    wrapper.write_text(f'#!/bin/sh\nREAL="{real}"\n{body}\n')
    wrapper.chmod(0o755)
    return {**cluster.env, "PATH": f"{folder}:{cluster.env['PATH']}"}


def reader(cluster: SlurmCluster, env: dict[str, str]) -> SlurmJobs:
    return SlurmJobs(
        node=cluster.node, gres_conf=cluster.gres_conf, env=env, timeout_s=READ_TIMEOUT_S
    )


def sleeping(marker: str) -> int:
    """How many processes run `sleep MARKER`."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == (
                f"sleep\0{marker}\0".encode()
            ):
                count += 1
        except OSError:
            continue
    return count


def test_a_wrappers_setsid_children_do_not_outlive_the_refreshes(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # GIVEN a job, and a squeue wrapper that leaves a child in a session of its own each
    # time it runs (a shell's `setsid cmd &`: the child inherits the output pipe)
    job_id = gpu_job(slurm, 1)
    marker = f"600.{uuid.uuid4().int % 10**6}"
    env = wrapped(slurm, tmp_path / "bin", "squeue", f'setsid sleep {marker} &\nexec "$REAL" "$@"')
    before = sleeping(marker)
    # WHEN the jobs are read 20 times
    tables = [reader(slurm, env).table() for _ in range(20)]
    # THEN each answer is Slurm's, and none of the wrapper's children is left running
    assert all(table is not None and table.job(job_id) is not None for table in tables)
    wait_until(lambda: sleeping(marker) == before, "the wrapper's children to be gone")


def test_a_record_that_cannot_be_believed_is_a_doubt_and_the_rest_stands(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # GIVEN two jobs, and squeue's real answer with the second's gres_detail made an object
    first, second = gpu_job(slurm, 1), gpu_job(slurm, 2)
    spoil = (
        "import json, sys\n"
        "data = json.load(sys.stdin)\n"
        "for job in data['jobs']:\n"
        f"    if job['job_id'] == {second}:\n"
        "        job['gres_detail'] = {'0': job['gres_detail'][0]}\n"
        "print(json.dumps(data))\n"
    )
    (tmp_path / "spoil.py").write_text(spoil)
    env = wrapped(
        slurm, tmp_path / "bin", "squeue", f'"$REAL" "$@" | {sys.executable} {tmp_path}/spoil.py'
    )
    # WHEN the jobs are read
    table = reader(slurm, env).table()
    # THEN the first job stands with its GPU; the second is a doubt naming no GPU (any of
    # the node's may be its), saying why in one line
    assert table is not None and [job.job_id for job in table.jobs] == [first]
    (doubt,) = table.doubts
    assert doubt.whole_node and doubt.why.startswith(f"job {second}: ")
    assert "gres_detail" in doubt.why


def test_a_json_answer_past_the_cap_gives_way_to_rows_for_good(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # GIVEN a job, and a squeue whose --json answer runs past the cap (as 22.05's does on a
    # big cluster: it lists every job, whatever it is asked)
    job_id = gpu_job(slurm, 2)
    over = MAX_OUTPUT_BYTES + 1
    body = f'"$REAL" "$@"\nif [ "$1" = --json ]; then head -c {over} /dev/zero; fi'
    env = wrapped(slurm, tmp_path / "bin", "squeue", body)
    jobs = reader(slurm, env)
    # WHEN the jobs are read
    table = jobs.table()
    # THEN they come from squeue's rows and the job's own scontrol detail
    assert table is not None and table.source == "squeue, scontrol"
    assert table.job(job_id) is not None and len(table.job(job_id).gpu_minor_numbers) == 2  # type: ignore[union-attr]


def test_an_answer_past_the_cap_every_way_makes_the_jobs_unknown_saying_so(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # GIVEN a squeue answering past the cap however it is asked
    gpu_job(slurm, 1)
    env = wrapped(
        slurm, tmp_path / "bin", "squeue", f"exec head -c {MAX_OUTPUT_BYTES + 1} /dev/zero"
    )
    jobs = reader(slurm, env)
    # WHEN the jobs are read THEN they are unknown, saying why in one line
    assert jobs.table() is None
    assert f"more than {MAX_OUTPUT_BYTES >> 20} MiB" in jobs.unknown_why()


@pytest.mark.parametrize(
    "gres_conf",
    [
        pytest.param("NodeName={node} Name=gpu File={dev}/nvidia[0-65535]\n", id="65536-files"),
        pytest.param(
            "NodeName=a[0-65535]b[0-65535] Name=gpu File={dev}/nvidia0\n", id="4-gi-nodes"
        ),
        pytest.param("include {dev}\n", id="include-of-a-folder"),
    ],
)
def test_a_gres_conf_beyond_the_bounds_makes_the_jobs_unknown_saying_why(
    slurm: SlurmCluster, tmp_path: Path, gres_conf: str
) -> None:
    # GIVEN a gres.conf no node could have, beside the cluster's real slurm.conf
    path = tmp_path / "gres.conf"
    path.write_text(gres_conf.format(node=slurm.node, dev=slurm.root / "dev"))
    jobs = SlurmJobs(node=slurm.node, gres_conf=path, env=slurm.env, timeout_s=READ_TIMEOUT_S)
    # WHEN the jobs are read THEN they are unknown, the reason one line naming the file
    assert jobs.table() is None
    why = jobs.unknown_why()
    assert str(path) in why and "\n" not in why and len(why) < 300
