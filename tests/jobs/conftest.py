"""Fixtures of the jobs tests: a real one-node Slurm (`slurm_cluster`, `slurm`) and a reader
pointed at it (`read_slurm`).

The cluster starts once per module (about 5 s) and skips, saying why, where it cannot start
(not root, slurm-wlm or munge missing), unless GPUWATCH_REQUIRE_SLURM=1 (set by .ci/run where
it installed them): then it fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from gpuwatch.jobs import JobTable
from tests.helpers.slurm import (
    GRES_ORDER,
    SlurmCluster,
    slurm_reader,
    start_cluster,
    why_not,
)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running one-node Slurm with 4 GPUs (device files with minor numbers 7, 5, 6, 4) and
    room for 50 jobs at once."""
    reason = why_not()
    if reason is not None:
        if os.environ.get("GPUWATCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"GPUWATCH_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    cluster = start_cluster(
        tmp_path_factory.mktemp("slurm"), gpu_minors=GRES_ORDER, oversubscribe=50
    )
    yield cluster
    cluster.close()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with every job cancelled after the test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()


@pytest.fixture
def read_slurm(slurm: SlurmCluster) -> Callable[..., JobTable | None]:
    """Reads the cluster's jobs afresh (a new reader: nothing cached)."""

    def read(**settings: float) -> JobTable | None:
        return slurm_reader(slurm, **settings).table()

    return read
