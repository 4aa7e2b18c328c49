"""The lab guide (docs/operations/lab.md), followed as a lab admin would: a daemon per machine,
the shipped prometheus.yml with its alerts and rules beside it, each user's fleet.toml, then
the installed `gpuwatch fleet` and `gpuwatch where`, and a machine that goes down."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.fleet.daemons import GIB, RunningDaemon, SimNode
from tests.helpers.fleet.prometheus import (
    Prometheus,
    PrometheusUnavailable,
    StartDaemons,
    prometheus_binary,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PAGE = ROOT / "docs" / "operations" / "lab.md"
SHIPPED = ("prometheus.yml", "gpuwatch-alerts.yml", "gpuwatch-fleet-rules.yml")
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))


def blocks(kind: str) -> list[str]:
    """The page's code blocks of `kind` (`toml`, `sh`)."""
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.DOTALL)


def lab_config(daemons: list[RunningDaemon]) -> str:
    """The shipped prometheus.yml with the lab's machines as its targets, scraped (and its
    rules evaluated) every second instead of every 15 s, so that the test need not wait."""
    text = (EXAMPLES / "prometheus.yml").read_text()
    example = '["node1:19400", "node2:19400", "node3:19400"]'
    assert example in text
    targets = json.dumps([daemon.address for daemon in daemons])
    return text.replace(example, targets).replace("15s", "1s")


@dataclass(frozen=True)
class Lab:
    prometheus: Prometheus
    daemons: list[RunningDaemon]


@pytest.fixture
def lab(tmp_path: Path, start_daemons: StartDaemons) -> Iterator[Lab]:
    """Two machines' daemons (gpu-01 with both GPUs free), and a Prometheus run from the
    shipped files, put side by side as the guide says."""
    try:
        prometheus_binary()
    except PrometheusUnavailable as error:
        if os.environ.get("GPUWATCH_REQUIRE_PROMETHEUS"):
            pytest.fail(str(error))
        pytest.skip(str(error).splitlines()[0])
    daemons = start_daemons(
        [SimNode("gpu-01", (0, 0), utilization_pct=0), SimNode("gpu-02", (40 * GIB, 0))]
    )
    home = tmp_path / "etc-prometheus"
    home.mkdir()
    for name in SHIPPED[1:]:
        shutil.copy(EXAMPLES / name, home / name)
    prometheus = Prometheus(home, 1.0, config=lab_config(daemons))
    prometheus.start([])
    try:
        yield Lab(prometheus, daemons)
    finally:
        prometheus.stop()


def gpuwatch(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The installed `gpuwatch ARGS` of a user whose home is `home`."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(home / ".config")}
    env.pop("GPUWATCH_PROMETHEUS", None)
    return subprocess.run(
        [GPUWATCH, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_the_shipped_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    # GIVEN the three shipped files side by side, as the guide copies them
    for name in SHIPPED:
        shutil.copy(EXAMPLES / name, tmp_path / name)
    # WHEN promtool checks the configuration, THEN it and its rule files are valid
    checked = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_lab_set_up_as_the_guide_says_and_a_machine_that_goes_down(
    lab: Lab, tmp_path: Path
) -> None:
    prometheus, daemons = lab.prometheus, lab.daemons
    prometheus.wait_until_up([d.address for d in daemons])
    # GIVEN a user's fleet.toml as the guide writes it, naming the lab's Prometheus
    (fleet_toml,) = [b for b in blocks("toml") if b.startswith("prometheus")]
    config = tmp_path / ".config" / "gpuwatch" / "fleet.toml"
    config.parent.mkdir(parents=True)
    config.write_text(fleet_toml.replace("http://prometheus.lab:9090", prometheus.url))
    # WHEN the user runs `gpuwatch fleet --once` and `gpuwatch where`, with no option
    table = gpuwatch("fleet", "--once", home=tmp_path)
    where = gpuwatch("where", "-n", "2", home=tmp_path)
    # THEN both machines are up, and gpu-01 can take a job of two GPUs
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("2 nodes: 2 up")
    assert where.returncode == 0 and where.stdout.startswith("gpu-01 GPUs 0,1"), where.stderr
    # WHEN gpu-01's daemon stops
    daemons[0].kill()
    prometheus.wait_until_up([daemons[0].address], up=False)
    table = gpuwatch("fleet", "--once", home=tmp_path)
    where = gpuwatch("where", "-n", "2", "-v", home=tmp_path)
    # THEN the table shows it down, with Prometheus's reason, as the guide's example does
    lines = table.stdout.splitlines()
    assert re.match(r"2 nodes: 1 up( \(1 warming up\))?, 1 down", lines[0])  # 10 minutes in
    assert any(re.match(r"gpu-01 +down", line) for line in lines)
    assert "gpu-01: down: Prometheus cannot scrape" in table.stdout
    assert "connection refused" in table.stdout
    # AND where places no job there, says why with -v, and exits 4: no machine fits now
    assert where.returncode == 4 and where.stdout == ""
    assert "gpu-01: down: Prometheus cannot scrape" in where.stderr
    # AND the shipped alert on a machine that cannot be scraped is on its way (5 minutes)
    prometheus.wait_for(
        'ALERTS{alertname="GpuwatchTargetDown"}',
        lambda found: any(s.labels.get("instance") == daemons[0].address for s in found),
        "GpuwatchTargetDown to be pending",
    )
