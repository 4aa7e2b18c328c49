"""The engine that selects GPUs for a job, under `gpuwatch pick` and `gpuwatch.select()`.

The steps: sample the GPUs, then, under the lease directory's lock, read the
leases in force and the jobs waiting ahead, let `policy.choose()` decide, and
claim what it chose. The lock is shared with every user, so it is held only
around those file operations, never across a driver or daemon call, and is
waited on with a deadline. Choosing again under the lock, from leases read
under it, is what keeps a GPU from two exclusive jobs and `--mem` from being
over-committed, however old the sample. Waiting repeats this until enough GPUs
qualify.

Whether a GPU is in use needs its processes: the driver's process lists are
read for every choice, the host's details of them (users, commands) only
when a choice fails and the reasons must name who uses each GPU. A GPU or MIG
device a job of the cluster holds (a Slurm job, a Kubernetes pod) is never
chosen, nor one whose holders nobody can tell (the scheduler down, slow or
malformed) unless the job allows it: who holds what is read as `gpuwatch status`
reads it (the daemon's table, else this node's job engine) into the one model of
holders (`gpuwatch.holders`), except inside a Slurm job, whose own GPUs are all it
may have.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.choices import MIG_ANY as ANY
from gpuwatch.choices import exclude_entries, named, said
from gpuwatch.errors import (
    DaemonUnavailableError,
    InvalidValueError,
    LeaseBusyError,
    NoGpuError,
    NotEnoughGpusError,
    WaitTimeoutError,
)
from gpuwatch.holders import NO_HOLDERS, Holders
from gpuwatch.leases.directory import (
    HELD_VARIABLE,
    LOCK_WAIT_S,
    HeldFile,
    HeldLease,
    LeaseDir,
    held_by_this_job,
    user_name,
)
from gpuwatch.models import Device, Lease, Snapshot
from gpuwatch.placement.gpus import GPUS, kind_for
from gpuwatch.placement.mig import (
    MIG_DEVICES,
    free_mig_devices,
    stale_mig_leases,
    usable_mig_devices,
)
from gpuwatch.placement.rules import Choice, Kind, Never, never, place
from gpuwatch.placement.slurmstep import SlurmStep, allowed_in_step, slurm_step, step_indices
from gpuwatch.placement.visible import (
    ORDER_VARIABLE,
    VARIABLE,
    resolve,
    resolve_mig,
    visible_entries,
)
from gpuwatch.request import Request, Waiter, describe_wish, request_of
from gpuwatch.sampling.node_jobs import JobsReader, jobs_reader
from gpuwatch.units import counted, format_size

POLL_S = 0.5
OnWait = Callable[[Request, Choice, float], None]
"""Told, while waiting, what is asked for, why it cannot be had yet, and for how long."""
OnNote = Callable[[str], None]
"""Told, in one line, of something the job should know but that does not stop it."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """A job's wishes as written, before GPU names are resolved against the machine."""

    asked: Request = field(default_factory=Request)
    """Everything but the GPU sets, which `resolve()` fills in."""
    exclude: tuple[str, ...] = ()
    visible: tuple[str, ...] | None = None
    """The CUDA_VISIBLE_DEVICES entries in force; `None` when it is unset."""
    device_order: str | None = None
    slurm: SlurmStep | None = None
    """The Slurm job or step this process runs in, whose GPUs are the ones to choose from;
    `None` outside one (see `gpuwatch.placement.slurmstep`)."""

    by_pick: bool = True
    """Speak of the wishes as `gpuwatch pick` writes them (`--exclude`), else as
    `gpuwatch.select()` does (`exclude`)."""

    @classmethod
    def from_wishes(cls, wishes: Mapping[str, Any], *, by_pick: bool) -> Wanted:
        """The one way pick and select() state a job's wishes: `wishes` holds a value for
        each of `choices.WISHES` (checked already), keyed by its field name; this process's
        CUDA_VISIBLE_DEVICES and order are read here.

        `exclude` is as `gpuwatch pick --exclude` and `select(exclude=...)` take it:
        comma-separated text, or GPU indices and names (see `choices.exclude_entries`).
        Inside a Slurm job or step its GPUs are read too (not for MIG devices).
        """
        wanted = cls(
            asked=request_of(wishes),
            exclude=exclude_entries(wishes["exclude"]),
            visible=visible_entries(os.environ.get(VARIABLE)),
            device_order=os.environ.get(ORDER_VARIABLE),
            by_pick=by_pick,
        )
        if wanted.wants_mig or not os.environ.get("SLURM_JOB_ID"):
            return wanted
        return replace(wanted, slurm=slurm_step(os.environ))

    @property
    def wants_mig(self) -> bool:
        """MIG devices are wanted: asked for, or all that CUDA_VISIBLE_DEVICES names
        (as Slurm and Kubernetes hand out MIG devices)."""
        visible = self.visible or ()
        return self.asked.mig is not None or (
            bool(visible) and all(entry.startswith("MIG-") for entry in visible)
        )

    @property
    def needs_names(self) -> bool:
        """Whether GPUs must be sampled with their names and minor numbers: index entries
        in CUDA's default order can be trusted only on a node of one model, and a Slurm
        step's GPUs are known by minor number."""
        indices = any(e.isdigit() for e in self.visible or ())
        return self.slurm is not None or (self.device_order != "PCI_BUS_ID" and indices)

    def resolve(self, snapshot: Snapshot, on_note: OnNote | None = None) -> Request:
        """The request in NVML indices; refuses one that no amount of waiting could meet."""
        if self.wants_mig:
            return self._resolve_mig(snapshot)
        gpus = snapshot.gpus
        job_gpus = None
        if self.slurm is not None:
            allowed, note = allowed_in_step(
                self.slurm, gpus, self.visible, device_order=self.device_order
            )
            job_gpus = step_indices(self.slurm, gpus)
            if note is not None and on_note is not None:
                on_note(note)
        elif self.visible is not None:
            allowed = resolve(self.visible, gpus, device_order=self.device_order)
        else:
            allowed = None
        if allowed is not None and not allowed:
            raise NoGpuError(
                f"{VARIABLE}={','.join(self.visible or ()) or '(empty)'} leaves no "
                "whole GPU to choose from"
            )
        excluded = resolve(
            self.exclude, gpus, device_order="PCI_BUS_ID", what=self._named("exclude")
        )
        request = replace(self.asked, allowed=allowed, excluded=excluded, job_gpus=job_gpus)
        if (why := never(GPUS, snapshot, request)) is None:
            return request
        if why.usable >= request.count:
            raise InvalidValueError(_too_small(GPUS, request, why))
        # GPUs in MIG mode are not given whole: too few outside it is said per GPU, with the
        # MIG devices to use instead, as any shortfall (`acquire` waits for none).
        usable = (allowed if allowed is not None else {gpu.index for gpu in gpus}) - excluded
        if request.count > len(usable):
            left = f" after {self._named('exclude')}" if excluded else ""
            raise InvalidValueError(
                f"{counted(request.count, 'GPU')} asked for, but "
                f"{self._has(allowed, len(usable))}{left}"
            )
        return request

    def _has(self, allowed: frozenset[int] | None, usable: int) -> str:
        """`this machine has 2`: what limits the GPUs to choose from, and to how many."""
        if self.slurm is not None:
            return f"this Slurm job has {usable} ({self.slurm.said})"
        return f"{'this machine has' if allowed is None else f'{VARIABLE} allows'} {usable}"

    def _resolve_mig(self, snapshot: Snapshot) -> Request:
        mig = self.asked.mig or ANY
        if not snapshot.mig_devices:
            if self.asked.mig is None:
                raise NoGpuError(
                    f"{VARIABLE} names only MIG devices, but no GPU on this machine has any"
                )
            raise NotEnoughGpusError(
                f"{self._said('mig', mig)}: no GPU on this machine has MIG devices",
                tuple(f"GPU {gpu.index}: MIG not enabled" for gpu in snapshot.gpus),
            )
        if self.asked.max_util_pct is not None:
            raise InvalidValueError(
                f"{self._named('max_util_pct')}: MIG devices report no utilization; leave it out"
            )
        allowed = None
        if self.visible is not None:
            allowed = resolve_mig(self.visible, snapshot, device_order=self.device_order)
            if not allowed:
                raise NoGpuError(f"{VARIABLE}={','.join(self.visible)} names no MIG device")
        whole = tuple(entry for entry in self.exclude if not entry.startswith("MIG-"))
        excluded = resolve(
            whole, snapshot.gpus, device_order="PCI_BUS_ID", what=self._named("exclude")
        )
        mig_excluded = resolve_mig(
            tuple(e for e in self.exclude if e.startswith("MIG-")),
            snapshot,
            device_order="PCI_BUS_ID",
            what=self._named("exclude"),
        )
        request = replace(
            self.asked, mig=mig, mig_allowed=allowed, mig_excluded=mig_excluded, excluded=excluded
        )
        any_profile = usable_mig_devices(snapshot, replace(request, mig=ANY))
        profiles = sorted({str(device.profile) for device in any_profile if device.profile})
        if mig != ANY and mig not in profiles:
            raise InvalidValueError(
                f"{self._said('mig', mig)}: no MIG device of that profile to choose from; "
                f"there are: {', '.join(profiles) or 'none'} (or use {self._said('mig', ANY)})"
            )
        if (why := never(MIG_DEVICES, snapshot, request)) is not None:
            if why.usable >= request.count:
                raise InvalidValueError(_too_small(MIG_DEVICES, request, why))
            of = "" if mig == ANY else f" of profile {mig}"
            raise InvalidValueError(
                f"{counted(request.count, 'MIG device')} asked for, but there "
                f"{'is' if why.usable == 1 else 'are'} {why.usable}{of} to choose from"
            )
        return request

    def _named(self, field: str) -> str:
        return named(field, by_pick=self.by_pick)

    def _said(self, field: str, value: object) -> str:
        return said(field, value, by_pick=self.by_pick)


def _too_small(kind: Kind, request: Request, why: Never) -> str:
    """`1 idle GPU with 100.0GiB free asked for, but no GPU to choose from has 100.0GiB of
    memory in all (the largest: 79.6GiB)`: a request for more memory than any device has."""
    size = format_size(why.needed_bytes)
    if why.large_enough:
        have = "has" if why.large_enough == 1 else "have"
        which = f"only {counted(why.large_enough, kind.noun)} to choose from {have}"
    else:
        which = f"no {kind.noun} to choose from has"
    largest = (
        "" if why.largest_bytes is None else f" (the largest: {format_size(why.largest_bytes)})"
    )
    return f"{describe_wish(request)} asked for, but {which} {size} of memory in all{largest}"


def simulated_daemon_note(backend: Backend) -> str | None:
    """One line for a job whose GPUs would come from a daemon that serves a simulated node,
    which the job did not ask for (as it does with `--sim`); `None` for any other."""
    socket_path = getattr(backend, "socket_path", None)
    if socket_path is None or backend.simulation is None:
        return None
    return (
        f"the daemon at {socket_path} serves a simulated node: its GPUs are made up "
        "and CUDA_VISIBLE_DEVICES names none of this machine's"
    )


def acquire(
    backend: Backend,
    wanted: Wanted,
    *,
    lease_dir: LeaseDir,
    command: str,
    hold: bool = True,
    wait: bool = False,
    timeout_s: float | None = None,
    on_wait: OnWait | None = None,
    on_note: OnNote | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[tuple[Device, ...], list[HeldLease]]:
    """Chooses GPUs (or MIG devices) and, with `hold`, leases them to this process; waits in
    line with `wait`. `on_note` hears notes that do not stop the job (Slurm's
    CUDA_VISIBLE_DEVICES naming GPUs other than the step's).

    Raises `NotEnoughGpusError` (or `WaitTimeoutError`) with a reason per GPU.
    """
    started = clock()
    request: Request | None = None
    ticket: HeldFile | None = None
    # GPUs leased to this job (and passed down to it) are its own to use: a script that
    # selected GPUs may start workers that call select() again, and nested picks are fine.
    mine = held_by_this_job()
    # GPU names are needed to resolve indices; host details of processes (users) only to say
    # who uses a GPU, when a choice fails.
    full = wanted.needs_names
    holders = HolderReader(backend, wanted)
    try:
        while True:
            try:
                snapshot = backend.sample(SampleScope.FULL if full else SampleScope.SELECTION)
            except DaemonUnavailableError as error:
                # The daemon restarts or hangs: a waiting job keeps its place, to its timeout.
                _wait_out(error, wait=wait, timeout_s=timeout_s, waited_s=clock() - started)
                sleep(POLL_S)
                continue
            request = request or wanted.resolve(snapshot, on_note)
            # What no device could ever give ends at once, with its reasons, waiting or not.
            waits = wait and never(kind_for(request), snapshot, request) is None
            # Read outside the lock: daemon calls and /proc are no file operations.
            outside = _Outside(
                _recent_utilization(backend, request),
                _own_pids(snapshot, lease_dir, mine) if mine else frozenset(),
                holders.read(snapshot),
            )
            try:
                with lease_dir.locked(_lock_wait_s(timeout_s, clock() - started)):
                    leases = _without_stale(lease_dir, lease_dir.leases(), snapshot)
                    ahead = lease_dir.waiting_before(ticket)
                    own = _own(mine, leases)
                    choice = _choose(snapshot, request, leases, own, ahead, outside)
                    if choice.satisfied:
                        held = (
                            _claim_all(lease_dir, choice.chosen, request, command) if hold else []
                        )
                        return choice.chosen, held
                    if not full and choice.in_use:
                        full = True  # to say who uses them: sample the host's details too
                        continue
                    if waits and ticket is None:
                        ticket = lease_dir.enqueue(request, command)
            except LeaseBusyError:
                # Any user can hold the lock: a job told to wait goes on waiting, to its timeout.
                if not wait or (timeout_s is not None and clock() - started >= timeout_s):
                    raise
                continue
            waited_s = clock() - started
            if not waits:
                raise _not_enough(backend, snapshot, request, choice, leases, outside.holders)
            if timeout_s is not None and waited_s >= timeout_s:
                raise WaitTimeoutError(
                    f"gave up after waiting {waited_s:.0f}s: {_shortfall(request, choice)}",
                    choice.reasons,
                )
            if on_wait is not None:
                on_wait(request, choice, waited_s)
            remaining = POLL_S if timeout_s is None else timeout_s - waited_s
            sleep(max(0.0, min(POLL_S, remaining)))
    finally:
        holders.close()
        if ticket is not None:
            ticket.release()


def _not_enough(
    backend: Backend,
    snapshot: Snapshot,
    request: Request,
    choice: Choice,
    leases: list[Lease],
    holders: Holders,
) -> NotEnoughGpusError:
    """Too few devices qualify: why for each, and what the job could ask for instead."""
    shortfall = (
        _shortfall(request, choice)
        + _unknown_hint(request, choice, holders)
        + _busy_hint(request, choice)
        + _mig_hint(backend, snapshot, request, leases)
    )
    return NotEnoughGpusError(shortfall, choice.reasons)


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


def _wait_out(
    error: DaemonUnavailableError, *, wait: bool, timeout_s: float | None, waited_s: float
) -> None:
    """Raises `error` unless the job waits and has time left."""
    if not wait:
        raise error
    if timeout_s is not None and waited_s >= timeout_s:
        raise WaitTimeoutError(f"gave up after waiting {waited_s:.0f}s: {error}") from None


def _unknown_hint(request: Request, choice: Choice, holders: Holders) -> str:
    """`; 8 GPUs left out: who holds them is unknown (jobs unknown: Slurm did not answer
    within 1s); --allow-unknown-holders takes them anyway`."""
    if not choice.holders_unknown:
        return ""
    noun = "GPU" if request.mig is None else "MIG device"
    why = f" ({holders.unknown_why})" if holders.unknown_why else ""
    return (
        f"; {counted(choice.holders_unknown, noun)} left out: who holds "
        f"{'it' if choice.holders_unknown == 1 else 'them'} is unknown{why}, and a job of "
        "the cluster may; --allow-unknown-holders takes them anyway"
    )


def _busy_hint(request: Request, choice: Choice) -> str:
    if not choice.in_use or not request.wants_idle:
        return ""
    return (
        f"; {counted(choice.in_use, 'GPU' if request.mig is None else 'MIG device')} in use "
        "left out: --mem SIZE shares one, --allow-busy takes them as free"
    )


def _lock_wait_s(timeout_s: float | None, waited_s: float) -> float:
    """How long to wait for the directory lock: `LOCK_WAIT_S`, or less when the
    timeout comes sooner."""
    return LOCK_WAIT_S if timeout_s is None else min(LOCK_WAIT_S, max(0.0, timeout_s - waited_s))


def _own(held: frozenset[str], leases: list[Lease]) -> frozenset[str]:
    """The ids in GPUWATCH_HELD of leases this user holds: the variable is only the
    environment, which another user's job may have been handed or may forge."""
    me = user_name(os.getuid())
    return frozenset(
        lease.lease_id for lease in leases if lease.lease_id in held and lease.user == me
    )


RECENT_WINDOW_S = 60.0
"""How far back a GPU's utilization counts, where the daemon's history tells it."""


def _recent_utilization(backend: Backend, request: Request) -> dict[str, float]:
    if request.mig is not None or request.util_limit_pct is None:
        return {}
    return backend.recent_utilization_pct(RECENT_WINDOW_S)


def _own_pids(snapshot: Snapshot, lease_dir: LeaseDir, held: frozenset[str]) -> frozenset[int]:
    """The processes on the GPUs that belong to this job: this process, the holders of its
    leases (`held`, from GPUWATCH_HELD), and their descendants (a nested select() or pick,
    workers a launcher started)."""
    if not snapshot.processes:
        return frozenset()
    leases = lease_dir.leases()  # a look without the lock: the pids of this job's own leases
    mine = _own(held, leases)
    roots = {os.getpid()} | {lease.pid for lease in leases if lease.lease_id in mine}
    return frozenset(process.pid for process in snapshot.processes if _descends(process.pid, roots))


def _descends(pid: int, roots: set[int]) -> bool:
    """Whether `pid` is one of `roots` or runs under one, as the host tells (a process of
    another PID namespace, or gone, is nobody's)."""
    for _ in range(_MAX_ANCESTORS):
        if pid in roots:
            return True
        if pid <= 1:
            return False
        try:
            pid = psutil.Process(pid).ppid()
        except psutil.Error:
            return False
    return False


_MAX_ANCESTORS = 64


@dataclass(frozen=True, slots=True)
class _Outside:
    """What a choice needs that is read outside the lease directory's lock (a daemon call,
    /proc): each GPU's recent utilization, the job's own processes, who holds each device."""

    recent_util_pct: dict[str, float]
    own_pids: frozenset[int]
    holders: Holders


def _choose(
    snapshot: Snapshot,
    request: Request,
    leases: list[Lease],
    mine: frozenset[str],
    ahead: list[Waiter],
    outside: _Outside,
) -> Choice:
    return place(
        kind_for(request),
        snapshot,
        request,
        leases=leases,
        mine=mine,
        own_pids=outside.own_pids,
        recent_util_pct=outside.recent_util_pct,
        waiting_ahead=ahead,
        seed=os.getpid(),
        holders=outside.holders,
    )


def _without_stale(lease_dir: LeaseDir, leases: list[Lease], snapshot: Snapshot) -> list[Lease]:
    """The leases, less those of MIG devices that are gone (the GPU was reconfigured);
    their files are removed, which is all a stale lease leaves behind."""
    if not any(lease.gpu_uuid.startswith("MIG-") for lease in leases):
        return leases
    stale = stale_mig_leases(snapshot, leases)
    for lease in stale:
        lease_dir.drop(lease)
    return [lease for lease in leases if lease not in stale]


def _mig_hint(backend: Backend, snapshot: Snapshot, request: Request, leases: list[Lease]) -> str:
    """`; 2 MIG devices are free: ...` when whole GPUs were asked for and only MIG devices are."""
    if request.mig is not None or not snapshot.mig_devices:
        return ""
    snapshot = backend.sample(SampleScope.FULL)  # whether they run processes: once, on failure
    free = free_mig_devices(snapshot, leases)
    if not free:
        return ""
    are = "is" if free == 1 else "are"
    return f"; {free} MIG device{'s' if free > 1 else ''} {are} free: use --mig PROFILE|any"


def _claim_all(
    lease_dir: LeaseDir, gpus: tuple[Device, ...], request: Request, command: str
) -> list[HeldLease]:
    held: list[HeldLease] = []
    try:
        for gpu in gpus:
            held.append(lease_dir.claim(gpu, mem_bytes=request.mem_bytes, command=command))
    except BaseException:
        for lease in held:  # all or none: a job never runs on part of what it asked for
            lease.release()
        raise
    return held


def passed_down(leases: list[HeldLease], environ: dict[str, str]) -> dict[str, str]:
    """`environ` telling the processes a job starts which leases are the job's own."""
    ids = [*held_by_this_job(), *(held.lease.lease_id for held in leases)]
    return {**environ, HELD_VARIABLE: ",".join(ids)} if ids else dict(environ)


def _shortfall(request: Request, choice: Choice) -> str:
    qualify = "qualifies" if choice.qualifying == 1 else "qualify"
    return f"{describe_wish(request)} wanted, {choice.qualifying} {qualify}"
