"""`/-/healthy` and `/-/ready`: Prometheus's own health endpoints, on the TCP listener."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.backends.sim import SimBackend
from gpuwatch.daemon.api import Api
from gpuwatch.daemon.settings import Settings
from gpuwatch.errors import BackendError
from gpuwatch.models import Snapshot
from gpuwatch.sampling.poller import Poller
from tests.helpers.daemon_net import tcp_daemon
from tests.helpers.wait import wait_until


class GatedDriver(Backend):
    """A driver whose first sample waits for `open`, and which fails while `failing`."""

    name = "gated"
    open = threading.Event()
    failing = threading.Event()

    def __init__(self) -> None:
        self._sim = SimBackend(2)

    def sample(self, scope: SampleScope = SampleScope.FULL) -> Snapshot:
        GatedDriver.open.wait(30)
        if GatedDriver.failing.is_set():
            raise BackendError("Driver Not Loaded")
        return self._sim.sample(scope)

    def close(self) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Api]:
    GatedDriver.open.clear()
    GatedDriver.failing.clear()
    poller = Poller(GatedDriver, 0.05, 60)
    poller.start()
    try:
        yield Api(poller, Settings(socket_path="unused"))
    finally:
        GatedDriver.open.set()
        poller.stop()


def test_ready_only_once_the_first_sample_is_there_and_while_sampling_works(api: Api) -> None:
    # GIVEN a daemon whose first sample has not come yet: healthy, not ready
    assert api.metrics_only("GET", "/-/healthy").status == 200
    before = api.metrics_only("GET", "/-/ready")
    assert before.status == 503 and b"no sample yet" in before.body
    # WHEN the first sample comes: ready
    GatedDriver.open.set()
    wait_until(lambda: api.metrics_only("GET", "/-/ready").status == 200, "ready")
    # WHEN sampling then fails as a whole: healthy still, not ready, and why
    GatedDriver.failing.set()
    wait_until(lambda: api.metrics_only("GET", "/-/ready").status == 503, "not ready")
    down = api.metrics_only("GET", "/-/ready")
    assert b"sampling fails" in down.body and b"Driver Not Loaded" in down.body
    assert api.metrics_only("GET", "/-/healthy").status == 200


def test_health_endpoints_over_tcp_and_nothing_else_of_the_api(tmp_path: Path) -> None:
    with tcp_daemon(tmp_path) as daemon:
        healthy, ready = daemon.get("/-/healthy"), daemon.get("/-/ready")
        snapshot = daemon.get("/v1/snapshot")
    assert (healthy.status, ready.status) == (200, 200)
    assert ready.headers["content-type"].startswith("text/plain")
    assert snapshot.status == 404, "the API stays on the machine"
