"""Bounded history and the poller that feeds it."""

from __future__ import annotations

import time

import pytest

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.history import History, history_bytes
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.sampling import Poller


def snapshot(
    taken_at: float, *, util: int | None = 50, power: float | None = 300.0, gpus: int = 2
) -> Snapshot:
    samples = tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-{i}",
            name="H100",
            pci_bus_id=None,
            memory_used_bytes=(i + 1) << 30,
            utilization_pct=util,
            temperature_c=60,
            power_w=power,
        )
        for i in range(gpus)
    )
    return Snapshot(taken_at, "node", None, None, samples, ())


def test_memory_is_allocated_once_and_stated() -> None:
    history = History(capacity=86_400, gpu_count=8)
    assert history.nbytes == history_bytes(86_400, 8) == 86_400 * 96
    for second in range(100):
        history.append(snapshot(float(second), gpus=8))
    assert history.nbytes == history_bytes(86_400, 8)


def test_keeps_the_newest_samples_in_order() -> None:
    history = History(capacity=3, gpu_count=2)
    for second in range(5):
        history.append(snapshot(float(second)))
    (first, second) = history.since(0.0)
    assert first.taken_at == [2.0, 3.0, 4.0]
    assert second.memory_used_bytes == [2 << 30] * 3 and second.uuid == "GPU-1"
    assert [series.taken_at for series in history.since(3.5)] == [[4.0], [4.0]]


def test_missing_values_come_back_as_none() -> None:
    history = History(capacity=2, gpu_count=2)
    history.append(snapshot(1.0, util=None, power=None))
    (series, _) = history.since(0.0)
    assert series.utilization_pct == [None] and series.power_w == [None]
    assert series.temperature_c == [60]


def test_resizing_keeps_the_newest_that_fit() -> None:
    history = History(capacity=4, gpu_count=2)
    for second in range(4):
        history.append(snapshot(float(second)))
    smaller = history.resized(2)
    assert smaller.since(0.0)[0].taken_at == [2.0, 3.0]
    bigger = history.resized(10)
    bigger.append(snapshot(9.0))
    assert bigger.since(0.0)[0].taken_at == [0.0, 1.0, 2.0, 3.0, 9.0]


class FlakyBackend(Backend):
    """Fails as a whole on its second sample, as a driver reloaded under the daemon does."""

    name = "flaky"
    opened = 0

    def __init__(self) -> None:
        FlakyBackend.opened += 1
        self.samples = 0

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        self.samples += 1
        if FlakyBackend.opened == 1 and self.samples == 2:
            raise RuntimeError("driver reloaded")
        return snapshot(time.time())

    def close(self) -> None:
        pass


def test_poller_survives_a_failing_backend_and_reopens_it() -> None:
    FlakyBackend.opened = 0
    poller = Poller(FlakyBackend, interval_s=0.05, history_s=60)
    poller.start()
    try:
        deadline = time.monotonic() + 20
        while poller.state.samples < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        poller.stop()
    assert poller.state.samples >= 4 and poller.state.error is None
    assert FlakyBackend.opened == 2, "the failed backend was closed and opened afresh"
    assert poller.history_size()[0] >= 4


def test_history_of_zero_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        History(capacity=0, gpu_count=1)


def test_a_window_keeps_the_newest_and_says_it_left_older_out() -> None:
    history = History(capacity=5, gpu_count=2)
    for second in range(8):  # wraps around the ring
        history.append(snapshot(float(second)))
    window = history.window(0.0, limit=2)
    assert window.truncated and window.series()[1].taken_at == [6.0, 7.0]
    whole = history.window(4.0, limit=10)
    assert not whole.truncated and whole.series()[0].taken_at == [4.0, 5.0, 6.0, 7.0]
    assert history.window(100.0, limit=10).series()[0].taken_at == []


def test_a_stalled_poller_is_reported_by_health() -> None:
    from gpuwatch.daemon.api import Api
    from gpuwatch.daemon.metrics import registry_for
    from gpuwatch.daemon.settings import Settings
    from gpuwatch.sampling import PollState

    poller = Poller(FlakyBackend, interval_s=1.0, history_s=60)
    api = Api(poller, Settings(socket_path="unused"), registry_for(lambda: (None, [], True)))
    # GIVEN a sample that came, and then a driver call that has not returned for 100 s
    poller.state = PollState(snapshot(time.time()), None, time.monotonic() - 100, 7)
    health = api.health({})
    assert health.status == 503 and b'"status": "stalled"' in health.body
    assert api.snapshot({}).status == 503
