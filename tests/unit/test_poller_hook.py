"""The poller's `after_sample` hook: fed every snapshot, and unable to break sampling."""

from __future__ import annotations

import pytest

from gpuwatch.backends.sim import SimBackend
from gpuwatch.models import Snapshot
from gpuwatch.sampling.poller import Poller
from tests.helpers.wait import wait_until


def test_the_hook_gets_every_snapshot_with_its_time() -> None:
    fed: list[tuple[Snapshot, float]] = []
    poller = Poller(lambda: SimBackend(2), 0.05, 10.0, after_sample=lambda s, t: fed.append((s, t)))
    poller.start()
    try:
        wait_until(lambda: len(fed) >= 3, "three snapshots fed")
    finally:
        poller.stop()
    times = [t for _, t in fed]
    assert times == sorted(times) and all(len(s.gpus) == 2 for s, _ in fed)


def test_a_failing_hook_fails_no_sample(caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a hook that always fails
    def broken(snapshot: Snapshot, taken_at: float) -> None:
        raise RuntimeError("broken hook")

    opened: list[SimBackend] = []

    def open_source() -> SimBackend:
        opened.append(SimBackend(2))
        return opened[-1]

    poller = Poller(open_source, 0.05, 10.0, after_sample=broken)
    poller.start()
    try:
        # THEN sampling goes on, reports no error, and the backend is not reopened
        wait_until(lambda: poller.state.samples >= 3, "three samples")
        assert poller.state.error is None and len(opened) == 1
    finally:
        poller.stop()
    assert "broken hook" in caplog.text
