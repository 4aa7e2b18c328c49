"""Fixtures of the fleet's tests: a real Prometheus, real gpuwatch daemons, stand-in
exporters. Each factory fixture starts what a test asks for and stops it at teardown.

    def test_x(start_prometheus, start_daemons, dcgm_endpoint):
        daemons = start_daemons([SimNode("node-a", (0, 40 * GIB))])
        prometheus = start_prometheus([Target(d.address) for d in daemons])
        prometheus.wait_until_up([d.address for d in daemons])
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn

import pytest

from tests.helpers.fleet.daemons import RunningDaemon, SimNode, running_daemons
from tests.helpers.fleet.endpoints import (
    Endpoint,
    SimFleet,
    hanging,
    refusing,
    serving_dcgm,
    serving_sim_fleet,
)
from tests.helpers.fleet.prometheus import (
    REQUIRE_ENV,
    Prometheus,
    PrometheusUnavailable,
    StartDaemons,
    StartPrometheus,
    StartSimFleet,
    Target,
    prometheus_binary,
    running_prometheus,
)
from tests.helpers.fleet.recorded import RecordedFleet, recorded_fleet


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{reason}\n({REQUIRE_ENV} is set: Prometheus must run here)")
    pytest.skip(reason.splitlines()[0])


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """`start_prometheus(targets=(), scrape_interval_s=1.0, rule_files=(),
    evaluation_interval_s=None) -> Prometheus`, ready for queries; skips (or fails under
    GPUWATCH_REQUIRE_PROMETHEUS) where it cannot run."""
    try:
        prometheus_binary()  # before the test starts anything else
    except PrometheusUnavailable as error:
        _unavailable(str(error))
    homes = (tmp_path / f"prometheus-{number}" for number in range(1_000))
    with ExitStack() as stack:

        def start(
            targets: Sequence[Target] = (),
            scrape_interval_s: float = 1.0,
            rule_files: Sequence[Path] = (),
            evaluation_interval_s: float | None = None,
        ) -> Prometheus:
            home = next(homes)
            try:
                return stack.enter_context(
                    running_prometheus(
                        home, targets, scrape_interval_s, rule_files, evaluation_interval_s
                    )
                )
            except PrometheusUnavailable as error:
                _unavailable(str(error))

        yield start


@pytest.fixture
def start_daemons(tmp_path: Path) -> Iterator[StartDaemons]:
    """`start_daemons(nodes: Sequence[SimNode], interval="1s") -> list[RunningDaemon]`:
    one real daemon per node, each serving `/metrics` on its own loopback port."""
    with ExitStack() as stack:

        def start(nodes: Sequence[SimNode], interval: str = "1s") -> list[RunningDaemon]:
            return stack.enter_context(
                running_daemons(tmp_path / "nodes", nodes, interval=interval)
            )

        yield start


@pytest.fixture
def start_sim_fleet() -> Iterator[StartSimFleet]:
    """`start_sim_fleet(nodes, gpus=8, hang=0, refuse=0, seed=0, jobs=False) -> SimFleet`:
    many simulated gpuwatch nodes in one process (cheaper than a daemon each)."""
    with ExitStack() as stack:

        def start(nodes: int, **options: int | bool) -> SimFleet:
            return stack.enter_context(serving_sim_fleet(nodes, **options))

        yield start


@pytest.fixture
def dcgm_endpoint() -> Iterator[Endpoint]:
    """A dcgm-exporter serving `data/dcgm.prom`: node `dcgm-node-1`, 4 H100s."""
    with serving_dcgm() as endpoint:
        yield endpoint


@pytest.fixture
def hanging_endpoint() -> Iterator[Endpoint]:
    """A node that accepts connections and never answers."""
    with hanging() as endpoint:
        yield endpoint


@pytest.fixture
def refusing_endpoint() -> Iterator[Endpoint]:
    """A node that refuses connections."""
    with refusing() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedFleet]:
    """The recorded exporter pages, each served, and a real Prometheus scraping them
    (`tests.helpers.fleet.recorded`), for a module's tests."""
    try:
        with recorded_fleet(tmp_path_factory.mktemp("recorded")) as fleet:
            yield fleet
    except PrometheusUnavailable as error:
        _unavailable(str(error))
