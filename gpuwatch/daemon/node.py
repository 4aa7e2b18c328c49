"""The node's name in everything the daemon serves (`--node-name`).

A daemon in a container sees the container's host name; Prometheus, `gpuwatch
fleet` and `gpuwatch where` must see the node's. The name enters once, where
snapshots come from: every snapshot the daemon takes carries it, so that its API,
its metrics and its clients (`status`, `tui`) all name the node alike.
"""

from __future__ import annotations

import os

import msgspec

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.models import Snapshot


def host_name() -> str:
    """This machine's name, as the NVIDIA backend names its snapshots."""
    return os.uname().nodename


class NamedNode(Backend):
    """`source`, with every snapshot named `node_name`."""

    def __init__(self, source: Backend, node_name: str) -> None:
        self._source = source
        self._node_name = node_name
        self.name = source.name

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        return msgspec.structs.replace(self._source.sample(scope), hostname=self._node_name)

    def recent_utilization_pct(self, window_s: float) -> dict[str, float]:
        return self._source.recent_utilization_pct(window_s)

    def close(self) -> None:
        self._source.close()
