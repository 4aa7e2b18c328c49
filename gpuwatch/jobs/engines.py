"""Which engine tells this node's jobs (`gpuwatch daemon --jobs auto|slurm|off`), and where
slurmd shows that its jobs changed.

`open_job_reader` answers a reader, or none and why: `auto` takes Slurm where `squeue` is on
PATH and a slurm.conf is found; `off` never asks. `slurmd_spool_dir` reads SlurmdSpoolDir
from slurm.conf: slurmd makes a socket there for each job step that starts and removes it
when the step ends, so a change of the folder says "ask again" sooner than any schedule,
for the cost of a stat.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from gpuwatch.jobs.slurm import SlurmJobs
from gpuwatch.jobs.slurm_places import configured_slurm_conf

ENGINES = ("auto", "slurm", "off")
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
DEFAULT_SPOOL_DIR = "/var/spool/slurmd"
"""Slurm's own default, where slurm.conf does not say."""
MAX_SLURM_CONF_BYTES = 1 << 20


def open_job_reader(
    engine: str, *, slurm_conf: str | None = None, timeout_s: float
) -> tuple[SlurmJobs | None, str | None]:
    """(a reader, `None`), or (`None`, why there is none) for `engine`."""
    if engine == "off":
        return None, "job reading is off (--jobs off)"
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = slurm_conf
    if engine == "auto" and shutil.which("squeue", path=env.get("PATH")) is None:
        return None, "no scheduler here: squeue is not on PATH (--jobs slurm to insist)"
    if engine == "auto" and configured_slurm_conf(env) is None:
        return None, (
            "no scheduler here: squeue is on PATH but no slurm.conf was found "
            "(give --slurm-conf, or --jobs slurm to insist)"
        )
    # The cache is the caller's: every start() asks Slurm, on the caller's schedule.
    return SlurmJobs(env=env, timeout_s=timeout_s, max_age_s=0.0), None


def slurmd_spool_dir(reader: SlurmJobs) -> Path | None:
    """The reader's node's SlurmdSpoolDir, from the slurm.conf its commands read; `None`
    when slurm.conf cannot be read."""
    conf = Path(reader.env.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    try:
        with open(conf, "rb") as file:
            text = file.read(MAX_SLURM_CONF_BYTES).decode(errors="replace")
    except OSError:
        return None
    return Path(spool_dir_in(text, reader.node))


def spool_dir_in(slurm_conf: str, node: str) -> str:
    """SlurmdSpoolDir of slurm.conf's text, with `%n` (the node) and `%h` (the host)
    filled in; Slurm's default where it is not set."""
    spool = DEFAULT_SPOOL_DIR
    for line in slurm_conf.splitlines():
        key, equals, value = line.split("#", 1)[0].strip().partition("=")
        if equals and key.strip().lower() == "slurmdspooldir" and value.strip():
            spool = value.strip()
    host = socket.gethostname().split(".")[0]
    return spool.replace("%n", node).replace("%h", host)
