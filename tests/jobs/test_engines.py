"""Choosing the job reader (`--jobs`), and where slurmd shows that its jobs changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.jobs import slurm_places
from gpuwatch.jobs.engines import open_job_reader
from gpuwatch.jobs.slurm import SlurmJobs, spool_dir


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ("SlurmdSpoolDir=/var/spool/slurm/%n\n", "/var/spool/slurm/gpu-07"),
        ("slurmdspooldir = /srv/spool # the node's own\n", "/srv/spool"),
        ("# SlurmdSpoolDir=/commented/out\nClusterName=c\n", "/var/spool/slurmd"),
    ],
    ids=["node-pattern", "spaces-and-comment", "slurms-default"],
)
def test_the_spool_folder_is_slurmds_own_for_this_node(
    conf: str, expected: str, tmp_path: Path
) -> None:
    (tmp_path / "slurm.conf").write_text(conf)
    assert spool_dir(tmp_path / "slurm.conf", "gpu-07") == Path(expected)


def test_the_node_name_given_is_slurms_name_for_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a daemon given --node-name (a container's host name is not the node's)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    reader, _ = open_job_reader("slurm", node="gpu-07", timeout_s=1.0)
    # THEN Slurm is asked about that node
    assert isinstance(reader, SlurmJobs) and reader.node == "gpu-07"
    # AND where slurmd's own SLURMD_NODENAME is set, that name, whatever the daemon shows
    monkeypatch.setenv("SLURMD_NODENAME", "from-env")
    reader, _ = open_job_reader("slurm", node="gpu-07", timeout_s=1.0)
    assert isinstance(reader, SlurmJobs) and reader.node == "from-env"


def test_off_never_makes_a_reader_and_says_so() -> None:
    reader, why = open_job_reader("off", timeout_s=1.0)
    assert reader is None and why == "job reading is off (--jobs off)"


def test_auto_takes_slurm_only_where_squeue_is_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a PATH without squeue
    monkeypatch.setenv("PATH", str(tmp_path))
    reader, why = open_job_reader("auto", timeout_s=1.0)
    assert reader is None and why is not None and "squeue is not on PATH" in why
    # WHEN squeue appears on it
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n")
    squeue.chmod(0o755)
    # THEN auto reads Slurm, with the slurm.conf given
    reader, why = open_job_reader("auto", slurm_conf="/etc/x/slurm.conf", timeout_s=1.0)
    assert isinstance(reader, SlurmJobs) and why is None
    assert reader.env["SLURM_CONF"] == "/etc/x/slurm.conf"
    assert reader.gres_conf == Path("/etc/x/gres.conf")


def test_auto_leaves_a_slurm_client_without_configuration_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN squeue on the PATH (a client package installed) but no slurm.conf anywhere
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurm_places, "SLURM_CONF_PLACES", (str(tmp_path / "slurm.conf"),))
    # WHEN auto chooses the reader
    reader, why = open_job_reader("auto", timeout_s=1.0)
    # THEN there is none, and it says why and how to insist
    assert reader is None and why is not None
    assert "no slurm.conf" in why and "--slurm-conf" in why
    # AND once slurm.conf exists, auto reads Slurm
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n")
    reader, why = open_job_reader("auto", timeout_s=1.0)
    assert isinstance(reader, SlurmJobs) and why is None
