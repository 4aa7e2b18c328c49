"""Fixtures of the jobs tests: a real one-node Slurm (`slurm_cluster`, `slurm`), a reader
pointed at it (`read_slurm`), and the environment that makes gpuwatch read the node's GPUs
(`backend`: its --sim scenario, or the real NVML backend over ../shared/fakenvml).

The cluster starts once per module (about 5 s) and skips, saying why, where it cannot start
(not root, slurm-wlm or munge missing), unless GPUWATCH_REQUIRE_SLURM=1 (set by .ci/run where
it installed them): then it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.jobs.job_table import JobTable
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


DATA = Path(__file__).parent / "data"
# As tests/jobs/test_slurm_real.py finds it: $FAKENVML_DIR, else ../shared beside the checkout.
FAKENVML = Path(
    os.environ.get("FAKENVML_DIR", Path(__file__).resolve().parents[3] / "shared" / "fakenvml")
)


@pytest.fixture(scope="module")
def fakenvml(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """fakenvml built once, or `None` where it cannot be."""
    if not (FAKENVML / "Makefile").is_file() or not (shutil.which("make") and shutil.which("cc")):
        return None
    build = tmp_path_factory.mktemp("fakenvml")
    subprocess.run(["make", "-s", "-C", str(FAKENVML), f"BUILD={build}"], check=True)
    return build


@pytest.fixture(params=["sim", "nvml"])
def backend(request: pytest.FixtureRequest, fakenvml: Path | None) -> Iterator[dict[str, str]]:
    """The environment that makes gpuwatch read the Slurm node's GPUs: the --sim scenario,
    or the real NVML backend over fakenvml with the same GPUs (/dev/nvidia4-7)."""
    if request.param == "sim":
        yield {"GPUWATCH_BACKEND": "sim", "GPUWATCH_SIM": str(DATA / "slurm-node.toml")}
        return
    if fakenvml is None:
        pytest.skip("needs ../shared/fakenvml (or FAKENVML_DIR), make and a C compiler")
    yield {
        "GPUWATCH_BACKEND": "nvml",
        "LD_LIBRARY_PATH": str(fakenvml),
        "FAKENVML_SCENARIO": str(DATA / "slurm-node.txt"),
    }
