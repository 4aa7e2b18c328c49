"""Which engine tells this node's jobs (`gpuwatch daemon --jobs auto|slurm|kubernetes|off`),
and the one interface every engine offers (`JobEngine`): nothing above this package knows
which engine answered.

`open_job_reader` answers an engine, or none and why: `auto` takes the kubelet where its
pod-resources socket is (a Kubernetes node), else Slurm where `squeue` is on PATH and a
slurm.conf is found; `off` never asks. Each engine is opened through a small registry
(`ENGINE_CLASSES`, name → where it is defined), as click's lazy group opens commands: a
node without a scheduler, or a command the daemon answers, loads neither.
"""

from __future__ import annotations

import importlib
import os
import shutil
import threading
from typing import Protocol

from gpuwatch.jobs.job_table import JobTable
from gpuwatch.jobs.kubelet_places import DEFAULT_SOCKET, is_socket
from gpuwatch.jobs.slurm_places import configured_slurm_conf
from gpuwatch.models import Snapshot

ENGINES = ("auto", "slurm", "kubernetes", "off")
ENGINE_CLASSES = {
    "slurm": "gpuwatch.jobs.slurm:SlurmJobs",
    "kubernetes": "gpuwatch.jobs.kubernetes:KubeletPods",
}
"""Each engine: its name, and where it is defined (`module:name`)."""


class JobEngine(Protocol):
    """Reads which jobs hold this node's GPUs, on a thread of its own, with a deadline.

    A caller keeps its own schedule: `start()` asks (returning at once), `latest()` is the
    answer as it stands (`None`: unknown, and `unknown_why()` says why). `observe()` is
    given the node's snapshot after each sample: an engine may need them to tell which GPU is
    which (NVML's order, UUIDs). `close()` stops it, killing a question under way.
    """

    timeout_s: float

    def start(self) -> threading.Thread | None:
        """Begins asking unless an answer is fresh or a question is under way; the
        question under way, if any."""

    def latest(self) -> JobTable | None:
        """The latest answer; `None` before the first, or when the jobs are unknown."""

    def unknown_why(self) -> str:
        """Why the jobs are unknown, in words."""

    def describe(self) -> str:
        """Whom it asks, in words, for a log: `Slurm's jobs`."""

    def observe(self, snapshot: Snapshot) -> None:
        """The node's GPUs and MIG devices, as last sampled."""

    def lacked_gpus(self) -> bool:
        """Whether the latest answer could not tell GPUs apart for want of `observe`'s GPUs
        (asked before the first sample): asked again now, it may."""

    def changes_path(self) -> os.PathLike[str] | None:
        """A folder whose change means "ask again" (slurmd's spool folder), or `None`."""

    def close(self) -> None:
        """Asks no more; a question under way is killed."""


def open_job_reader(
    engine: str,
    *,
    slurm_conf: str | None = None,
    node: str | None = None,
    pod_resources_socket: str = DEFAULT_SOCKET,
    timeout_s: float,
) -> tuple[JobEngine | None, str | None]:
    """(an engine, `None`), or (`None`, why there is none) for `engine`. `node`: the node's
    name to the scheduler (the daemon's --node-name), where it is not the host's;
    `pod_resources_socket`: the kubelet's."""
    if engine == "off":
        return None, "job reading is off (--jobs off)"
    if engine == "kubernetes" or (engine == "auto" and is_socket(pod_resources_socket)):
        pods: JobEngine = _defined("kubernetes")(pod_resources_socket, timeout_s=timeout_s)
        return pods, None
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
    slurm: JobEngine = _defined("slurm")(env=env, node=node, timeout_s=timeout_s, max_age_s=0.0)
    return slurm, None


def _defined(engine: str) -> type:
    """The class of `engine`, its module imported now."""
    module, name = ENGINE_CLASSES[engine].split(":")
    found: type = getattr(importlib.import_module(module), name)
    return found
