"""Who holds what, for a job choosing GPUs: the cluster's holders of each device (a Slurm
job, a Kubernetes pod, or that nobody can tell: `gpuwatch.holders`), read through the daemon
or this node's job engine; and which of the devices' processes and leases are the job's own
(it may run under leases it holds, and start workers that choose again).
"""

from __future__ import annotations

import os

from gpuwatch import procfs
from gpuwatch.backends.base import Backend
from gpuwatch.holders import NO_HOLDERS, Holders
from gpuwatch.leases.directory import LeaseDir, user_name
from gpuwatch.models import Lease, Snapshot
from gpuwatch.placement.wanted import Wanted
from gpuwatch.sampling.node_jobs import JobsReader, jobs_reader


class HolderReader:
    """Who holds each device for the cluster (a Slurm job, a Kubernetes pod), or that
    nobody can tell: read through the daemon that `backend` reads, else this node's job
    engine; nothing inside a Slurm job (its own GPUs are all it may choose from)."""

    def __init__(self, backend: Backend, wanted: Wanted) -> None:
        self._reader: JobsReader | None = None
        if wanted.slurm is None:
            self._reader = jobs_reader(backend, one_shot=True)
            self._reader.start()

    def read(self, snapshot: Snapshot) -> Holders:
        """The holders of `snapshot`'s devices (never waiting past the reader's deadline)."""
        if self._reader is None:
            return NO_HOLDERS
        self._reader.observe(snapshot)
        return self._reader.read().holders(snapshot)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def own_leases(held: frozenset[str], leases: list[Lease]) -> frozenset[str]:
    """The ids in GPUWATCH_HELD of leases this user holds: the variable is only the
    environment, which another user's job may have been handed or may forge."""
    me = user_name(os.getuid())
    return frozenset(
        lease.lease_id for lease in leases if lease.lease_id in held and lease.user == me
    )


def own_pids(snapshot: Snapshot, lease_dir: LeaseDir, held: frozenset[str]) -> frozenset[int]:
    """The processes on the GPUs that belong to this job: this process, the holders of its
    leases (`held`, from GPUWATCH_HELD), and their descendants (a nested select() or pick,
    workers a launcher started)."""
    if not snapshot.processes:
        return frozenset()
    leases = lease_dir.leases()  # a look without the lock: the pids of this job's own leases
    mine = own_leases(held, leases)
    roots = {os.getpid()} | {lease.pid for lease in leases if lease.lease_id in mine}
    return frozenset(process.pid for process in snapshot.processes if _descends(process.pid, roots))


def _descends(pid: int, roots: set[int]) -> bool:
    """Whether `pid` is one of `roots` or runs under one, as the host tells (a process of
    another PID namespace, or gone, is nobody's)."""
    for _ in range(_MAX_ANCESTORS):
        if pid in roots:
            return True
        parent = procfs.read_parent(pid) if pid > 1 else None
        if parent is None:
            return False
        pid = parent
    return False


_MAX_ANCESTORS = 64
