"""Bounded history and the poller that feeds it."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.models import GpuSample, Snapshot
from gpuwatch.sampling.history import History, history_bytes
from gpuwatch.sampling.poller import Poller
from tests.helpers.wait import wait_until


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
    assert history.nbytes == history_bytes(86_400, 8) == 86_400 * 104
    for second in range(100):
        history.append(snapshot(float(second), gpus=8), float(second))
    assert history.nbytes == history_bytes(86_400, 8)


def test_keeps_the_newest_samples_in_order() -> None:
    history = History(capacity=3, gpu_count=2)
    for second in range(5):
        history.append(snapshot(float(second)), float(second))
    (first, second) = history.since(0.0)
    assert first.taken_at == [2.0, 3.0, 4.0]
    assert second.memory_used_bytes == [2 << 30] * 3 and second.uuid == "GPU-1"
    assert [series.taken_at for series in history.since(3.5)] == [[4.0], [4.0]]


def test_missing_values_come_back_as_none() -> None:
    history = History(capacity=2, gpu_count=2)
    history.append(snapshot(1.0, util=None, power=None), 1.0)
    (series, _) = history.since(0.0)
    assert series.utilization_pct == [None] and series.power_w == [None]
    assert series.temperature_c == [60]


def test_resizing_keeps_the_newest_that_fit() -> None:
    history = History(capacity=4, gpu_count=2)
    for second in range(4):
        history.append(snapshot(float(second)), float(second))
    smaller = history.resized(2)
    assert smaller.since(0.0)[0].taken_at == [2.0, 3.0]
    bigger = history.resized(10)
    bigger.append(snapshot(9.0), 9.0)
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
        wait_until(
            lambda: poller.state.samples >= 4, "four samples", timeout_s=20, interval_s=0.005
        )
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
        history.append(snapshot(float(second)), float(second))
    window = history.window(0.0, limit=2)
    assert window.truncated and window.series()[1].taken_at == [6.0, 7.0]
    whole = history.window(4.0, limit=10)
    assert not whole.truncated and whole.series()[0].taken_at == [4.0, 5.0, 6.0, 7.0]
    assert history.window(100.0, limit=10).series()[0].taken_at == []


def test_a_stalled_poller_is_reported_by_health() -> None:
    from gpuwatch.daemon.api import Api
    from gpuwatch.daemon.settings import Settings
    from gpuwatch.sampling.poller import PollState

    poller = Poller(FlakyBackend, interval_s=1.0, history_s=60)
    api = Api(poller, Settings(socket_path="unused"))
    # GIVEN a sample that came, and then a driver call that has not returned for 100 s
    poller.state = PollState(
        snapshot(time.time()), None, time.monotonic() - 100, 7, time.monotonic() - 100
    )
    health = api.health({})
    assert health.status == 503 and b'"status": "stalled"' in health.body
    assert api.snapshot({}).status == 503


@pytest.mark.parametrize(
    ("field", "absurd"),
    [
        ("temperature_c", 4294967295),
        ("temperature_c", -40000),
        ("utilization_pct", 300),
        ("utilization_pct", -1),
        ("memory_used_bytes", -(1 << 30)),
        ("memory_used_bytes", 1 << 60),
        ("power_w", float("inf")),
        ("power_w", -5.0),
    ],
    ids=[
        "temp-uint32-max",
        "temp-negative",
        "util-300",
        "util-negative",
        "mem-negative",
        "mem-huge",
        "power-inf",
        "power-negative",
    ],
)
def test_an_absurd_sensor_value_is_stored_as_missing_for_that_gpu_only(
    field: str, absurd: float
) -> None:
    # GIVEN a snapshot where GPU 1 reports an absurd value
    history = History(capacity=4, gpu_count=2)
    good = snapshot(1.0)
    gpus = (good.gpus[0], msgspec.structs.replace(good.gpus[1], **{field: absurd}))
    # WHEN it is appended
    history.append(msgspec.structs.replace(good, gpus=gpus), 1.0)
    # THEN that value comes back missing, and everything else as it was
    first, second = history.since(0.0)
    assert getattr(second, field) == [None]
    assert first.temperature_c == [60] and first.utilization_pct == [50]
    assert second.temperature_c == ([60] if field != "temperature_c" else [None])


def test_gpus_are_kept_by_their_place_and_named_by_their_index() -> None:
    # GIVEN a node whose GPU 2 was lost: its GPUs are 0, 1 and 3
    history = History(capacity=2, gpu_count=3)
    base = snapshot(1.0, gpus=3)
    gpus = (*base.gpus[:2], msgspec.structs.replace(base.gpus[2], index=3, uuid="GPU-3"))
    history.append(msgspec.structs.replace(base, gpus=gpus), 1.0)
    # THEN each GPU's series is named by its NVML index
    assert [(series.index, series.uuid) for series in history.since(0.0)] == [
        (0, "GPU-0"),
        (1, "GPU-1"),
        (3, "GPU-3"),
    ]


def test_the_last_seconds_are_chosen_by_the_monotonic_clock_not_the_wall_clock() -> None:
    # GIVEN samples one second apart, with the wall clock stepped back an hour midway
    history = History(capacity=100, gpu_count=1)
    for second in range(30):
        wall = 1_700_000_000.0 + second - (3600 if second >= 15 else 0)
        history.append(snapshot(wall, gpus=1), 1000.0 + second)
    # WHEN the last 2 s are asked for (on the monotonic clock)
    (series,) = history.since(1000.0 + 29 - 2)
    # THEN 3 samples come back, the newest last, with their Unix times for display
    assert series.taken_at == [1_700_000_000.0 + s - 3600 for s in (27, 28, 29)]


def test_the_daemon_answers_last_2s_with_2s_of_samples_after_a_clock_step() -> None:
    from gpuwatch.daemon.api import Api
    from gpuwatch.daemon.settings import Settings

    # GIVEN a poller that sampled every 0.1 s for 3 s, its wall clock an hour ahead until
    # it was stepped back at the last sample
    poller = Poller(FlakyBackend, interval_s=0.1, history_s=60)
    now = time.monotonic()
    poller._history = History(poller.history_capacity, 2)
    for tenth in range(30):
        at = now - 3 + tenth / 10
        wall = time.time() - 3 + tenth / 10 + (3600 if tenth < 29 else 0)
        poller._history.append(snapshot(wall), at)
    api = Api(poller, Settings(socket_path="unused"))
    # WHEN a client asks for the last 2 s
    body = json.loads(api.history({"last": "2s"}).body)
    # THEN about 20 samples come back, not 30
    assert 15 <= len(body["gpus"][0]["taken_at"]) <= 21


class AbsurdBackend(Backend):
    """GPU 0 reports a temperature of 4294967295, as a broken sensor does."""

    name = "absurd"

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        good = snapshot(time.time())
        hot = msgspec.structs.replace(good.gpus[0], temperature_c=4294967295, utilization_pct=300)
        return msgspec.structs.replace(good, gpus=(hot, good.gpus[1]))

    def close(self) -> None:
        pass


def test_an_absurd_sensor_value_does_not_stop_sampling() -> None:
    # GIVEN a poller over a GPU with a broken sensor
    poller = Poller(AbsurdBackend, interval_s=1.0, history_s=60)
    # WHEN it samples
    poller._sample_once()
    # THEN sampling succeeds: the snapshot is served, the history holds the value as missing
    assert poller.state.error is None and poller.state.samples == 1
    series, _ = poller.history_since(0.0, 10)
    assert series[0].temperature_c == [None] and series[1].temperature_c == [60]


def test_a_wall_clock_stepped_forward_does_not_make_the_snapshot_stale() -> None:
    from gpuwatch.daemon.api import Api
    from gpuwatch.daemon.settings import Settings
    from gpuwatch.sampling.poller import PollState

    # GIVEN a snapshot sampled just now, whose Unix time is an hour behind (the wall clock
    # was stepped forward since)
    poller = Poller(FlakyBackend, interval_s=1.0, history_s=60)
    now = time.monotonic()
    poller.state = PollState(snapshot(time.time() - 3600), None, now, 1, now)
    # WHEN a client asks for it THEN it is current: its age comes from the monotonic clock
    assert Api(poller, Settings(socket_path="unused")).snapshot({}).status == 200
