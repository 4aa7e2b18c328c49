"""Signalling processes from the table: who may be signalled, and sending the signal.

The kernel has the last word (a refused signal is reported, never raised);
the checks here keep the confirmation honest: it lists only processes the
user may signal, and says why the others were left out.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from gpuwatch.tui.rows import Row

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
_START_TOLERANCE_S = 2.0


@dataclass(frozen=True, slots=True)
class Target:
    """A process the user may signal, as it will be named in the confirmation."""

    pid: int
    user: str
    command: str
    started_at: float | None


@dataclass(frozen=True, slots=True)
class Plan:
    """Who would get the signal, and who was left out and why."""

    targets: tuple[Target, ...]
    refused: tuple[str, ...]
    as_root: bool


def may_signal(my_uid: int, target_uids: tuple[int, int]) -> bool:
    """The kernel's rule for kill(2): root, or our uid is the target's real or saved uid."""
    return my_uid == 0 or my_uid in target_uids


def plan(rows: Iterable[Row], my_uid: int | None = None) -> Plan:
    """Sorts `rows` into processes the user may signal and the others (with a reason)."""
    import psutil

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
            process = psutil.Process(row.pid)
            uids = process.uids()
            user = process.username()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            refused.append(f"pid {row.pid}: no such process here (another container, or gone)")
            continue
        except (psutil.AccessDenied, KeyError):
            refused.append(f"pid {row.pid}: hidden from you")
            continue
        if not may_signal(uid, (uids.real, uids.saved)):
            refused.append(f"pid {row.pid}: belongs to {user}, not you")
            continue
        targets.append(Target(row.pid, user, row.command or process.name(), row.started_at))
    return Plan(tuple(targets), tuple(refused), uid == 0)


def send(targets: Iterable[Target], name: str) -> list[str]:
    """Sends signal `name` to each target; one line per target saying what happened."""
    import psutil

    number = SIGNALS[name]
    outcomes = []
    for target in targets:
        try:
            process = psutil.Process(target.pid)
            if (
                target.started_at is not None
                and abs(process.create_time() - target.started_at) > _START_TOLERANCE_S
            ):
                outcomes.append(f"pid {target.pid}: now another process; not signalled")
                continue
            process.send_signal(number)
        except psutil.NoSuchProcess:
            outcomes.append(f"pid {target.pid}: already gone")
        except psutil.AccessDenied:
            outcomes.append(f"pid {target.pid}: not permitted")
        except OSError as error:
            outcomes.append(f"pid {target.pid}: {error.strerror or error}")
        else:
            outcomes.append(f"pid {target.pid}: {name} sent")
    return outcomes
