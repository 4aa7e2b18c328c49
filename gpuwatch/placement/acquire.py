"""The loop that selects GPUs for a job and claims them, under `gpuwatch pick` and
`gpuwatch.select()`; what the job wants is `gpuwatch.placement.wanted`, who holds what
`gpuwatch.placement.holding`.

The steps: sample the GPUs, then, under the lease directory's lock, read the
leases in force and the jobs waiting ahead, let the placement rules decide, and
claim what they chose. The lock is shared with every user, so it is held only
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
from collections.abc import Callable

import msgspec

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import (
    DaemonUnavailableError,
    LeaseBusyError,
    NotEnoughGpusError,
    WaitTimeoutError,
)
from gpuwatch.holders import Holders
from gpuwatch.leases.directory import (
    HELD_VARIABLE,
    LOCK_WAIT_S,
    HeldFile,
    HeldLease,
    LeaseDir,
    held_by_this_job,
)
from gpuwatch.models import Device, Lease, Snapshot
from gpuwatch.placement.gpus import kind_for
from gpuwatch.placement.holding import HolderReader, own_leases, own_pids
from gpuwatch.placement.mig import free_mig_devices, stale_mig_leases
from gpuwatch.placement.rules import Choice, never, place
from gpuwatch.placement.wanted import OnNote, Wanted
from gpuwatch.request import Request, Waiter, describe_wish
from gpuwatch.units import counted

POLL_S = 0.5
OnWait = Callable[[Request, Choice, float], None]
"""Told, while waiting, what is asked for, why it cannot be had yet, and for how long."""


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
                own_pids(snapshot, lease_dir, mine) if mine else frozenset(),
                holders.read(snapshot),
            )
            try:
                with lease_dir.locked(_lock_wait_s(timeout_s, clock() - started)):
                    leases = _without_stale(lease_dir, lease_dir.leases(), snapshot)
                    ahead = lease_dir.waiting_before(ticket)
                    own = own_leases(mine, leases)
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


RECENT_WINDOW_S = 60.0
"""How far back a GPU's utilization counts, where the daemon's history tells it."""


def _recent_utilization(backend: Backend, request: Request) -> dict[str, float]:
    if request.mig is not None or request.util_limit_pct is None:
        return {}
    return backend.recent_utilization_pct(RECENT_WINDOW_S)


class _Outside(msgspec.Struct, frozen=True):
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
