"""A node's GPU cards as the fleet shows them: as `gpuwatch tui` draws a machine, and each
card naming the scheduler's job on its GPU as the node's daemon exported it, and the
Kubernetes pods holding it (`(namespace/pod)`), as its exporter labels it.

Pure, and without Textual.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec.structs import replace

from gpuwatch.fleet_model import GpuJob, GpuPod, NodeState
from gpuwatch.gpu_history import GpuSeries
from gpuwatch.tui.common import render
from gpuwatch.tui.common.frames import Backfill, Frame
from gpuwatch.tui.common.layout import CHROME_LINES, MIN_TABLE_LINES, Layout, choose_layout
from gpuwatch.tui.common.section import Section


class FleetSection(Section):
    """A fleet node's cards, which also name the scheduler's job on each GPU as the node's
    daemon exported it (`job 4242 carol, idle 35m`), first in the card's title. Their graphs
    start with the source's history of the node where it keeps one (`waits_for_history`),
    else with the reads made while the node is open."""

    def __init__(self, node: str, interval_s: float, *, waits_for_history: bool) -> None:
        super().__init__(0, node, interval_s)
        self.node = node
        self.node_jobs: tuple[GpuJob, ...] = ()
        self.node_pods: tuple[GpuPod, ...] = ()
        self.history_done = not waits_for_history
        self._latest: tuple[NodeState, float] | None = None

    def apply_history(self, series: Sequence[GpuSeries], note: str) -> None:
        """The source's past of this node: drawn once the next (or latest) read comes."""
        self.apply_backfill(Backfill(self.node, tuple(series), note))
        self.history_done = True
        if self._latest is not None:
            self.apply_node(*self._latest)

    def apply_node(self, node: NodeState, received_at: float) -> None:
        """A new read of the node (`received_at`: the monotonic time it came)."""
        self._latest = (node, received_at)
        if not self.history_done:
            return  # the history goes in first, or the series would drop the past
        frame = Frame(node.name, node.snapshot, node.leases or (), error=node.error, local=False)
        self.apply(frame, received_at)
        self.node_jobs = node.jobs or ()
        self.node_pods = node.pods
        if node.error and not node.up:
            self.error = node.error

    def card_input(
        self, gpu_index: int, monotonic_now: float, card_width: int, idle_after_s: float
    ) -> render.CardInput:
        card = super().card_input(gpu_index, monotonic_now, card_width, idle_after_s)
        jobs = [job for job in self.node_jobs if job.gpu_index == gpu_index]
        pods = [pod for pod in self.node_pods if pod.gpu_index == gpu_index]
        note = " + ".join(filter(None, (job_note(jobs, idle_after_s), pod_note(pods))))
        return replace(card, idle_note=f"{note}  {card.idle_note}".strip()) if note else card


def job_note(jobs: Sequence[GpuJob], idle_after_s: float) -> str:
    """`job 4242 alice, idle 35m`: the jobs holding one GPU, for its card; the idle time once
    the node's daemon has seen the job leave it idle for `idle_after_s`."""
    parts = []
    for job in jobs:
        text = f"job {job.job_id} {job.user or '?'}"
        idle = job.allocated_idle_s
        if idle and idle >= idle_after_s:
            text += f", idle {render.duration(idle)}"
        parts.append(text)
    return " + ".join(parts)


def pod_note(pods: Sequence[GpuPod]) -> str:
    """`pod (ml/train-0)`: the Kubernetes pods holding one GPU (or a MIG device of it)."""
    return " + ".join(f"pod ({pod.name})" for pod in pods)


def node_layout(section: Section, width: int, height: int) -> Layout:
    """The cards' layout on a screen of their own, `width` x `height`."""
    frame = section.frame
    snapshot = frame.snapshot if frame is not None else None
    gpus = [len(snapshot.gpus) if snapshot is not None else 1]
    # The cards have the whole screen: ask for a layout as if the process table were below.
    tall = (height + 1) * 5 // 3 + CHROME_LINES + MIN_TABLE_LINES
    return choose_layout(width, tall, gpus)
