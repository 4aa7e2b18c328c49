"""MIG devices that vanish: remembered between samples, so a backend can report them on their GPU.

A MIG device disappears when its GPU is reconfigured (or leaves MIG mode), and
whatever ran in it is gone with it. Nothing in a later sample would say so, so
the backend reports it in its GPU's `error` for `keep_s` seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.models import MigDevice

KEEP_S = 300.0


class MigChanges:
    """Each GPU's MIG devices at its last sample, and those that vanished since."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self._keep_s = keep_s
        self._seen: dict[int, dict[str, str]] = {}
        self._vanished: dict[int, dict[str, tuple[str, float]]] = {}

    def notes(self, gpu_index: int, devices: Sequence[MigDevice], now: float) -> list[str]:
        """What to report on the GPU, given all its MIG devices now (none out of MIG mode)."""
        seen = {d.uuid: f"{d.label} ({d.profile or '?'})" for d in devices if d.uuid is not None}
        vanished = self._vanished.setdefault(gpu_index, {})
        for uuid, what in self._seen.get(gpu_index, {}).items():
            if uuid not in seen:
                vanished[uuid] = (f"MIG device {what} {uuid} vanished (reconfigured)", now)
        self._seen[gpu_index] = seen
        for uuid, (_, since) in list(vanished.items()):
            if uuid in seen or now - since > self._keep_s:
                del vanished[uuid]
        return [note for note, _ in vanished.values()]

    def lost_with(self, gpu_index: int, error: str) -> str:
        """A GPU's read error, naming the MIG devices it had: they are out of reach with it."""
        if not (seen := self._seen.get(gpu_index)):
            return error
        return f"{error} (with its MIG devices {', '.join(sorted(seen.values()))})"
