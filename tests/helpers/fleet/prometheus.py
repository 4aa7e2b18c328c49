"""A real Prometheus for the fleet's tests: started on a free loopback port with its own
data directory and a generated configuration, waited for by polling, stopped cleanly.

    with running_prometheus(tmp_path / "prom", [Target(daemon.address)]) as prometheus:
        prometheus.wait_until_up([daemon.address])
        samples = prometheus.query("gpuwatch_memory_free_bytes")

The configuration is JSON, which Prometheus reads as the YAML it is a subset of. Every
target is a static target of its job; `metrics_path` and labels may differ per target.
Where `prometheus` is not installed, or will not start here, `PrometheusUnavailable` says
why: the fixtures skip with that reason, or fail where GPUWATCH_REQUIRE_PROMETHEUS is set.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.fleet.promql import ROUND_BEHIND_S
from tests.helpers.fleet.daemons import RunningDaemon
from tests.helpers.fleet.endpoints import (
    SimFleet,
)
from tests.helpers.fleet.net import fetch, free_port
from tests.helpers.wait import wait_until

REQUIRE_ENV = "GPUWATCH_REQUIRE_PROMETHEUS"
READY_TIMEOUT_S = 90.0
WAIT_TIMEOUT_S = 60.0
_PORT_TRIES = 3


class PrometheusUnavailable(Exception):
    """Prometheus is not installed, or cannot run here; the message says which."""


@dataclass(frozen=True)
class Target:
    """One scrape target: `address` is `HOST:PORT`; its series get `instance=address`
    and `job`, plus `labels`."""

    address: str
    job: str = "gpuwatch"
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)
    honor_labels: bool = False
    """The job's `honor_labels` (the same for every target of a job): whether the
    exporter's labels win over `labels`, else they are renamed `exported_NAME`."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant query's answer."""

    labels: dict[str, str]
    value: float
    timestamp_s: float


def prometheus_binary() -> str:
    """The path of `prometheus`, or `PrometheusUnavailable`."""
    if path := shutil.which("prometheus"):
        return path
    raise PrometheusUnavailable(
        "prometheus is not installed (Debian: apt-get install --no-install-recommends "
        "prometheus; .ci/run installs it)"
    )


def config_text(
    targets: Sequence[Target],
    scrape_interval_s: float,
    rule_files: Sequence[Path] = (),
    evaluation_interval_s: float | None = None,
) -> str:
    """Prometheus's configuration scraping `targets` every `scrape_interval_s`, and
    evaluating `rule_files` every `evaluation_interval_s` (as often, by default)."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    honor: dict[str, bool] = {}
    for target in targets:
        labels = dict(target.labels)
        if target.metrics_path != "/metrics":
            labels["__metrics_path__"] = target.metrics_path
        jobs.setdefault(target.job, []).append({"targets": [target.address], "labels": labels})
        honor[target.job] = target.honor_labels
    interval = f"{round(scrape_interval_s * 1000)}ms"
    evaluation = f"{round((evaluation_interval_s or scrape_interval_s) * 1000)}ms"
    return json.dumps(
        {
            # A timeout as long as the interval: the longest Prometheus allows, so that a
            # slow scrape on a loaded machine is not taken for a down node.
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": evaluation,
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "honor_labels": honor[job], "static_configs": groups}
                for job, groups in jobs.items()
            ],
        },
        indent=1,
    )


class Prometheus:
    """A running Prometheus server (see `running_prometheus`)."""

    def __init__(
        self,
        home: Path,
        scrape_interval_s: float,
        rule_files: Sequence[Path] = (),
        evaluation_interval_s: float | None = None,
        config: str | None = None,
    ) -> None:
        """`config`: the configuration's text as it is (rule files relative to `home`), in
        place of one made of the targets, the intervals and `rule_files`."""
        self.home = home
        self.scrape_interval_s = scrape_interval_s
        self.rule_files = tuple(rule_files)
        self.evaluation_interval_s = evaluation_interval_s
        self.config = config
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its base URL, `http://127.0.0.1:PORT`: what `--prometheus` takes."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "prometheus.log"

    def start(self, targets: Sequence[Target]) -> None:
        binary = prometheus_binary()
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config(targets)
        for _ in range(_PORT_TRIES):
            self.port = free_port()
            if self._started(binary):
                return
            if "address already in use" not in self.log():
                break
        raise PrometheusUnavailable(f"prometheus did not start:\n{self.log()}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)

    def set_targets(self, targets: Sequence[Target]) -> None:
        """Scrapes `targets` from now on, in place of the previous ones (a reload)."""
        self._write_config(targets)
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=WAIT_TIMEOUT_S):
            pass

    def api(self, path: str, **params: str) -> Any:
        """`data` of a GET on the HTTP API, e.g. `api("/api/v1/query", query="up")`."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=WAIT_TIMEOUT_S) as answer:
            document = json.load(answer)
        assert document.get("status") == "success", document
        return document["data"]

    def query(self, promql: str) -> list[Sample]:
        """The series of an instant query as a read now sees them: evaluated
        `ROUND_BEHIND_S` ago, as a source evaluates its queries."""
        at = f"{time.time() - ROUND_BEHIND_S:.3f}"
        data = self.api("/api/v1/query", query=promql, time=at)
        assert data["resultType"] == "vector", data
        return [
            Sample(item["metric"], float(item["value"][1]), float(item["value"][0]))
            for item in data["result"]
        ]

    def wait_for(
        self,
        promql: str,
        condition: Callable[[list[Sample]], bool],
        what: str,
        timeout_s: float = WAIT_TIMEOUT_S,
    ) -> list[Sample]:
        """Polls `promql` until `condition(samples)`; returns those samples."""

        def met() -> tuple[list[Sample]] | None:  # a tuple: true even around no samples
            samples = self.query(promql)
            return (samples,) if condition(samples) else None

        return wait_until(met, what, timeout_s=timeout_s, interval_s=0.1)[0]

    def wait_for_count(self, selector: str, count: int) -> None:
        """Waits until Prometheus holds exactly `count` series of `selector` now."""

        def reached(samples: list[Sample]) -> bool:
            return count == (samples[0].value if samples else 0)

        self.wait_for(f"count({selector})", reached, f"{count} series of {selector}")

    def wait_until_up(
        self, addresses: Sequence[str], up: bool = True, timeout_s: float = WAIT_TIMEOUT_S
    ) -> None:
        """Waits until each target's latest scrape succeeded (`up`) or failed (`up=False`)."""
        wanted = 1.0 if up else 0.0

        def reached(samples: list[Sample]) -> bool:
            values = {sample.labels.get("instance"): sample.value for sample in samples}
            return all(values.get(address) == wanted for address in addresses)

        state = "up" if up else "down"
        self.wait_for("up", reached, f"{', '.join(addresses)} to be {state}", timeout_s)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def _write_config(self, targets: Sequence[Target]) -> None:
        text = self.config or config_text(
            targets, self.scrape_interval_s, self.rule_files, self.evaluation_interval_s
        )
        (self.home / "prometheus.yml").write_text(text)

    def _started(self, binary: str) -> bool:
        argv = [
            binary,
            f"--config.file={self.home / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._process.poll() is None and time.monotonic() < deadline:
            if fetch(f"{self.url}/-/ready", timeout_s=5).startswith(b"Prometheus Server is Ready"):
                return True
            time.sleep(0.05)
        self.stop()
        return False


@contextmanager
def running_prometheus(
    home: Path,
    targets: Sequence[Target] = (),
    scrape_interval_s: float = 1.0,
    rule_files: Sequence[Path] = (),
    evaluation_interval_s: float | None = None,
) -> Iterator[Prometheus]:
    """A Prometheus scraping `targets` and recording `rule_files` (every
    `evaluation_interval_s`, by default as often as it scrapes), ready to answer queries
    (it has not necessarily scraped yet: `wait_until_up`); stopped when the block ends."""
    prometheus = Prometheus(home, scrape_interval_s, rule_files, evaluation_interval_s)
    try:
        prometheus.start(targets)
        yield prometheus
    finally:
        prometheus.stop()


StartPrometheus = Callable[..., Prometheus]


StartDaemons = Callable[..., list[RunningDaemon]]


StartSimFleet = Callable[..., SimFleet]
