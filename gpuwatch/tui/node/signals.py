"""Signalling processes from the table: who may be signalled, and sending the signal.

The kernel has the last word (a refused signal is reported, never raised);
the checks here keep the confirmation honest: it lists only processes the
user may signal, and says why the others were left out.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

import msgspec
import psutil

from gpuwatch.leases.directory import user_name
from gpuwatch.text import printable
from gpuwatch.tui.common import render
from gpuwatch.tui.node.rows import Row

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
_START_TOLERANCE_S = 2.0


class Target(msgspec.Struct, frozen=True):
    """A process the user may signal, as it will be named in the confirmation."""

    pid: int
    user: str
    command: str
    started_at: float | None


class Plan(msgspec.Struct, frozen=True):
    """Who would get the signal, and who was left out and why."""

    targets: tuple[Target, ...]
    refused: tuple[str, ...]
    as_root: bool


def may_signal(my_uid: int, target_uids: tuple[int, int]) -> bool:
    """The kernel's rule for kill(2): root, or our uid is the target's real or saved uid."""
    return my_uid == 0 or my_uid in target_uids


def plan(rows: Iterable[Row], my_uid: int | None = None) -> Plan:
    """Sorts `rows` into processes the user may signal and the others (with a reason)."""
    uid = os.geteuid() if my_uid is None else my_uid
    targets, refused, seen = [], [], set()
    for row in rows:
        if row.pid in seen:
            continue  # one process on several GPUs: one signal
        seen.add(row.pid)
        if not row.local:
            refused.append(f"pid {row.pid}: on {row.source}, not on this machine")
            continue
        try:
            uids = psutil.Process(row.pid).uids()
        except psutil.Error:
            refused.append(f"pid {row.pid}: no such process here (another container, or gone)")
            continue
        user = user_name(uids[0])
        if not may_signal(uid, (uids[0], uids[2])):
            refused.append(f"pid {row.pid}: belongs to {user}, not you")
            continue
        targets.append(Target(row.pid, user, row.command or _name(row.pid), row.started_at))
    return Plan(tuple(targets), tuple(refused), uid == 0)


def _name(pid: int) -> str:
    try:
        return printable(psutil.Process(pid).name())
    except psutil.Error:
        return "?"


def send(targets: Iterable[Target], name: str) -> list[str]:
    """Sends signal `name` to each target; one line per target saying what happened.

    A target whose pid now names a process started at another time is left alone: the
    one confirmed has exited, and the pid was given to another."""
    number = SIGNALS[name]
    outcomes = []
    for target in targets:
        try:
            if (
                target.started_at is not None
                and abs(psutil.Process(target.pid).create_time() - target.started_at)
                > _START_TOLERANCE_S
            ):
                outcomes.append(f"pid {target.pid}: now another process; not signalled")
                continue
            os.kill(target.pid, number)
        except (ProcessLookupError, psutil.NoSuchProcess):
            outcomes.append(f"pid {target.pid}: already gone")
        except PermissionError:
            outcomes.append(f"pid {target.pid}: not permitted")
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else None
            outcomes.append(f"pid {target.pid}: {reason or error}")
        else:
            outcomes.append(f"pid {target.pid}: {name} sent")
    return outcomes


def confirm_text(signal_name: str, plan: Plan) -> render.Line:
    """What the confirmation says: who would get the signal, and who was left out."""
    spans: render.Line = []
    if plan.as_root:
        spans.append(("You are root: this can stop anyone's job.\n\n", "alarm"))
    if plan.targets:
        spans.append((f"Send {signal_name} to:\n", "heading"))
        for target in plan.targets:
            command = render.fit(target.command, 60).rstrip()
            spans.append((f"  pid {target.pid}  {target.user}  {command}\n", ""))
    else:
        spans.append((f"No process to send {signal_name} to.\n", "heading"))
    if plan.refused:
        spans.append(("\nLeft out:\n", "heading"))
        for reason in plan.refused:
            spans.append((f"  {reason}\n", ""))
    return spans
