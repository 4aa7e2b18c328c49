"""A fleet read from a Prometheus HTTP API: a fixed number of queries whatever the fleet's
size, staleness judged from the data's own times, and a server that is not Prometheus one
clear SourceError."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from gpuwatch.choices import Strategy
from gpuwatch.errors import InvalidValueError, SourceError
from gpuwatch.fleet import promql, summaries
from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.series import PREFIXES, target_state
from gpuwatch.fleet_model import Exporter, FleetState
from gpuwatch.placement.rules import needed_bytes
from gpuwatch.placement.where import where
from gpuwatch.request import Request
from gpuwatch.tui.fleet.rows import build_rows
from tests.helpers.fleet.endpoints import Endpoint
from tests.helpers.fleet.fakeprom import (
    NOW,
    FakePrometheus,
    FakeTarget,
    with_node_figures,
    with_verdicts,
)
from tests.helpers.fleet.servers import Reply, always, fixture, serving

DCGM = fixture("dcgm_node.prom").decode()
SMI = fixture("nvidia_smi_node.prom").decode()


def dcgm_node(number: int, **options: object) -> FakeTarget:
    text = DCGM.replace("dgx-a100-03", f"dgx-{number:03}")
    return FakeTarget("dcgm", f"10.0.0.{number}:9400", text, **options)  # type: ignore[arg-type]


def refresh_queries(count: int) -> tuple[list[str], list[str]]:
    """The queries of a first and of a later refresh of `count` dcgm-exporter nodes."""
    prometheus = FakePrometheus([dcgm_node(n) for n in range(count)])
    with serving(prometheus) as url:
        source = PrometheusSource(url)
        fleet = source.read()
        first = list(prometheus.asked)
        source.read()
    assert [node.name for node in fleet.nodes] == [f"dgx-{n:03}" for n in range(count)]
    assert all(node.up and node.exporter is Exporter.DCGM for node in fleet.nodes)
    assert fleet.taken_at == NOW
    assert fleet.source == f"prometheus {url}"
    return sorted(first), sorted(prometheus.asked[len(first) :])


def test_a_refresh_costs_the_same_queries_for_one_node_or_forty() -> None:
    # GIVEN Prometheus scraping one dcgm-exporter node, or forty
    # WHEN the fleet is read twice
    one, forty = refresh_queries(1), refresh_queries(40)
    # THEN each refresh sends the same few queries, whatever the fleet's size
    assert one == forty
    assert len(one[1]) <= 16


def test_a_refresh_asks_only_for_the_families_of_exporters_the_fleet_runs() -> None:
    # GIVEN Prometheus scraping dcgm-exporter nodes only
    _, later = refresh_queries(3)
    # THEN later refreshes ask for no gpuwatch or nvidia_gpu_exporter family
    families = [q for q in later if not q.startswith("label_replace")]  # all but names
    assert not [q for q in families if "gpuwatch_" in q or "nvidia_smi_" in q]
    assert "DCGM_FI_DEV_FB_FREE" in families


def test_a_target_prometheus_cannot_scrape_is_down_under_its_last_name() -> None:
    gone = FakeTarget("gpuwatch", "10.0.0.7:19400", "", up=False, hostname="gpu-node-07")
    gone.snapshot_at = NOW - 90
    prometheus = FakePrometheus([dcgm_node(1), gone])
    with serving(prometheus) as url:
        fleet = PrometheusSource(url).read()
    by_name = {node.name: node for node in fleet.nodes}
    node = by_name["gpu-node-07"]
    assert node.up is False and node.snapshot is None
    assert node.age_s == pytest.approx(90)
    assert node.error is not None and "10.0.0.7:19400" in node.error


def test_a_node_whose_last_scrape_is_old_is_stale_not_current() -> None:
    old = dcgm_node(2, scraped_at=NOW - 600)
    prometheus = FakePrometheus([dcgm_node(1), old])
    with serving(prometheus) as url:
        fleet = PrometheusSource(url, stale_after_s=120).read()
    stale = {node.name: node for node in fleet.nodes}["dgx-002"]
    assert stale.up is False
    assert stale.age_s == pytest.approx(600)
    assert stale.error is not None and "stale" in stale.error


def test_nvidia_gpu_exporter_nodes_are_named_by_instance_host() -> None:
    target = FakeTarget("smi", "gpu-box-3:9835", SMI.replace("1.751475457e+09", repr(NOW - 3)))
    with serving(FakePrometheus([target])) as url:
        (node,) = PrometheusSource(url).read().nodes
    assert (node.name, node.up, node.exporter) == ("gpu-box-3", True, Exporter.NVIDIA_GPU_EXPORTER)


def test_history_asks_one_range_query_for_the_nodes_target() -> None:
    prometheus = FakePrometheus([dcgm_node(1)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        source.read()
        assert source.history("dgx-001", duration_s=600) == ()
        assert source.history("no-such-node") == ()
    (asked,) = prometheus.ranges
    assert 'instance="10.0.0.1:9400"' in asked["query"] and 'job="dcgm"' in asked["query"]
    assert float(asked["end"]) - float(asked["start"]) == pytest.approx(600)


def error_json(message: str) -> Reply:
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": message})
    return Reply(body.encode(), status=400, content_type="application/json")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (Reply(b"<!doctype html><title>Grafana</title>", content_type="text/html"), "web page"),
        (Reply(b"404 page not found", status=404), "HTTP 404"),
        (error_json("parse error at char 3\x1b[2J"), "refuses the query: parse error"),
        (Reply(b"{not json", content_type="application/json"), "without JSON"),
        (Reply(b'["a list"]', content_type="application/json"), "not Prometheus's API"),
        (Reply(b'{"status": "success", "data": {"resultType": "matrix", "result": []}}'), "vector"),
        (Reply(b"", status=401), "credentials"),
        (Reply(b"", endless_bytes=100 << 20, content_type="application/json"), "too large"),
        (Reply(b"{" * 10_000, drip_s=0.01, content_type="application/json"), "within 1s"),
    ],
    ids=["html", "404", "status-error", "not-json", "json-list", "matrix", "401", "100MB", "drip"],
)
def test_a_server_that_is_not_prometheus_is_one_clear_line(reply: Reply, says: str) -> None:
    with serving(always(reply)) as url:
        source = PrometheusSource(url, timeout_s=1.0 if reply.drip_s else 10.0)
        with pytest.raises(SourceError) as raised:
            source.read()
    message = str(raised.value)
    assert says in message and url in message
    assert message.isprintable()


def test_a_refused_connection_is_one_clear_line(refusing_endpoint: Endpoint) -> None:
    url = f"http://{refusing_endpoint.address}"
    with pytest.raises(SourceError, match="connection refused"):
        PrometheusSource(url, timeout_s=1.0).read()


@pytest.mark.parametrize(
    "url",
    ["ftp://prom:9090", "prom:9090", "http://alice:secret@prom:9090", "http://", "http://p:x/"],
    ids=["ftp", "no-scheme", "credentials", "no-host", "port-name"],
)
def test_a_url_that_is_not_http_is_refused_before_any_request(url: str) -> None:
    # a bad value, as any option's (exit 2), not a server that cannot be read (exit 6)
    with pytest.raises(InvalidValueError) as raised:
        PrometheusSource(url)
    assert "secret" not in str(raised.value)


def test_a_gpuwatch_node_through_prometheus_is_the_node_scraped_directly() -> None:
    # GIVEN a daemon's /metrics, read by Prometheus (its values without identity labels,
    # leases, down GPUs and MIG mode only where set) and read directly
    text = fixture("gpuwatch_node.prom").decode()
    taken_at = 1.7954727494912333e09
    target = FakeTarget("gpuwatch", "10.0.0.7:19400", text, scraped_at=taken_at + 1)
    with serving(FakePrometheus([target])) as url:
        (through, *_) = PrometheusSource(url, clock=lambda: NOW).read().nodes
    samples = list(parse_exposition(text, PREFIXES))
    direct = target_state(samples, fallback_name="x", seen_at=NOW, now=NOW, stale_after_s=1e9)
    # THEN both tell the same GPUs, leases, MIG devices and processes
    assert through.snapshot is not None and direct.snapshot is not None
    unsplit = [replace(gpu, mig_enabled=gpu.mig_enabled or None) for gpu in direct.snapshot.gpus]
    assert list(through.snapshot.gpus) == unsplit
    assert through.leases == direct.leases
    assert through.snapshot.mig_devices == direct.snapshot.mig_devices
    assert through.snapshot.processes == direct.snapshot.processes


GPUWATCH = fixture("gpuwatch_node.prom").decode()


def gpuwatch_node(number: int, *, full: bool = False) -> FakeTarget:
    """The fixture's daemon as node `gpu-node-NN`; `full`: every GPU's memory in use."""
    text = GPUWATCH.replace("gpu-node-07", f"gpu-node-{number:02}")
    if full:
        for family, value in (("used", 8.0e10), ("free", 1.0e9)):
            line = rf"^(gpuwatch_memory_{family}_bytes\{{.*\}}) .*$"
            text = re.sub(line, rf"\1 {value!r}", text, flags=re.MULTILINE)
    return FakeTarget("gpuwatch", f"10.0.1.{number}:9400", text, scraped_at=NOW - 5)


def read_twice() -> tuple[FleetState, FleetState, list[str], list[str]]:
    """Two reads of two gpuwatch daemons that Prometheus did not scrape in between: the
    fleet each time, and the queries each read sent."""
    prometheus = FakePrometheus([gpuwatch_node(1), gpuwatch_node(2)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        first = source.read()
        asked = len(prometheus.asked)
        second = source.read()
    return first, second, prometheus.asked[:asked], prometheus.asked[asked:]


def test_gpu_identity_is_read_on_the_first_refresh_and_not_on_the_next() -> None:
    # GIVEN Prometheus scraping two gpuwatch daemons
    # WHEN the fleet is read twice
    first, second, asked_first, asked_second = read_twice()
    # THEN the second read asks no identity, and tells the same GPUs
    assert any("gpuwatch_gpu_info" in q for q in asked_first)
    assert not any("gpuwatch_gpu_info" in q for q in asked_second)
    assert first.nodes == second.nodes


def test_a_node_new_to_the_fleet_gets_its_identity_read_at_once() -> None:
    # GIVEN a source that has read a fleet of one gpuwatch daemon
    prometheus = FakePrometheus([gpuwatch_node(1)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        source.read()
        # WHEN a second daemon joins
        prometheus.targets.append(gpuwatch_node(2))
        fleet = source.read()
    # THEN its GPUs are there with their uuids and models
    node = {node.name: node for node in fleet.nodes}["gpu-node-02"]
    assert node.snapshot is not None
    assert all(gpu.uuid and gpu.name for gpu in node.snapshot.gpus)


def test_a_read_for_placement_leaves_out_what_the_rules_never_read() -> None:
    # GIVEN a gpuwatch daemon through Prometheus
    prometheus = FakePrometheus([gpuwatch_node(1)])
    with serving(prometheus) as url:
        # WHEN it is read for placement and for the screen
        placed = PrometheusSource(url, clock=lambda: NOW, placement=True).read()
        shown = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN placement asks no temperature or power, and sees the same memory, leases, MIG
    assert not [q for q in prometheus.asked[: len(prometheus.asked) // 2] if "temperature" in q]
    (a,), (b,) = placed.nodes, shown.nodes
    assert a.snapshot is not None and b.snapshot is not None
    for gpu, full in zip(a.snapshot.gpus, b.snapshot.gpus, strict=True):
        assert gpu.temperature_c is None and gpu.power_w is None
        assert (gpu.uuid, gpu.memory_free_bytes, gpu.memory_used_bytes, gpu.error) == (
            full.uuid,
            full.memory_free_bytes,
            full.memory_used_bytes,
            full.error,
        )
    assert a.leases == b.leases
    assert a.snapshot.mig_devices == b.snapshot.mig_devices


@pytest.mark.parametrize(
    "request_",
    [
        Request(),
        Request(count=2, min_free_bytes=40 << 30),
        Request(mem_bytes=10 << 30),
        Request(mem_bytes=60 << 30),
        Request(min_free_bytes=20 << 30, max_util_pct=50, allow_busy=True),
        Request(count=3, allow_busy=True),
        Request(mig="1g.10gb"),
    ],
    ids=["idle-gpu", "two-with-40GiB", "mem-10GiB", "mem-60GiB", "max-util-50", "three", "mig"],
)
def test_a_placed_read_gives_where_the_same_fits_as_a_whole_read(request_: Request) -> None:
    # GIVEN five gpuwatch daemons (a GPU down, one MIG-enabled, an exclusive lease and a
    # shared one with declared memory on each), three with every GPU's memory in use
    nodes = [gpuwatch_node(n, full=n > 2) for n in range(1, 6)]
    with serving(FakePrometheus(nodes)) as url:
        source = PrometheusSource(url, clock=lambda: NOW, placement=True)
        # WHEN where runs on a read for placement, and on a whole read
        needed = needed_bytes(request_) if request_.mig is None else None
        placed = source.read_placed(needed)
        whole = PrometheusSource(url, clock=lambda: NOW, placement=True).read()
    # THEN it finds the same nodes and the same devices, with the same free memory
    assert placed is not None
    assert where(placed, request_).fits == where(whole, request_).fits


def placed_queries(count: int) -> list[str]:
    """The queries a read for placement of `count` gpuwatch daemons sends."""
    prometheus = FakePrometheus([gpuwatch_node(n) for n in range(1, count + 1)])
    with serving(prometheus) as url:
        fleet = PrometheusSource(url, clock=lambda: NOW, placement=True).read_placed(40 << 30)
    assert fleet is not None and len(fleet.nodes) == count
    return prometheus.asked


def test_a_placed_read_is_one_round_of_the_same_queries_for_two_nodes_or_thirty() -> None:
    # GIVEN Prometheus scraping two gpuwatch daemons, or thirty
    # WHEN each fleet is read for placement
    two, thirty = placed_queries(2), placed_queries(30)
    # THEN both send the same few queries, each once: one round, names included, and
    # neither GPU info (free and total memory carry the uuids) nor MIG devices
    assert sorted(two) == sorted(thirty)
    assert len(set(two)) == len(two) <= 14
    assert not [q for q in two if "gpuwatch_gpu_info" in q or "gpuwatch_mig_memory" in q]


def test_a_placed_read_of_a_fleet_with_other_exporters_asks_for_a_whole_read() -> None:
    # GIVEN a fleet of a gpuwatch daemon and a dcgm-exporter node
    with serving(FakePrometheus([gpuwatch_node(1), dcgm_node(2)])) as url:
        # WHEN it is read for placement
        fleet = PrometheusSource(url, clock=lambda: NOW, placement=True).read_placed(None)
    # THEN it says to read it whole, whose families the names told
    assert fleet is None


def family_queries(asked: list[str]) -> list[str]:
    """The queries of GPU series among `asked` (not names, `up` or scrape times)."""
    return [q for q in asked if "gpuwatch_" in q and not q.startswith("label_replace")]


def test_a_refresh_with_no_new_scrape_reads_no_gpu_series() -> None:
    # GIVEN a source that has read two gpuwatch daemons
    # WHEN it reads again before Prometheus scraped either
    first, second, _, asked_second = read_twice()
    # THEN it asks only when they were scraped, and shows the same nodes
    assert not family_queries(asked_second)
    assert second.nodes == first.nodes


def test_a_refresh_reads_again_only_the_nodes_scraped_since() -> None:
    # GIVEN a source that has read two gpuwatch daemons
    prometheus = FakePrometheus([gpuwatch_node(1), gpuwatch_node(2)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        first = {node.name: node for node in source.read().nodes}
        asked = len(prometheus.asked)
        # WHEN Prometheus scrapes the second again, and finds its GPUs full
        prometheus.targets[1] = replace(gpuwatch_node(2, full=True), scraped_at=NOW - 1)
        second = source.read()
        queries = family_queries(prometheus.asked[asked:])
        whole = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN its GPU series are asked for the node scraped since only, named in each
    # selector (not the first), and the fleet is as a source reading it whole sees it
    second_only = promql.instances([prometheus.targets[1].instance])
    assert queries and all(second_only in q for q in queries)
    assert second.nodes == whole.nodes
    assert second.nodes[1] != first["gpu-node-02"]


def test_a_node_whose_scrape_fails_after_a_read_is_down_not_its_old_gpus() -> None:
    # GIVEN a source that has read two gpuwatch daemons
    prometheus = FakePrometheus([gpuwatch_node(1), gpuwatch_node(2)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        source.read()
        # WHEN Prometheus's next scrape of the second fails
        down = {"up": False, "scraped_at": NOW - 1, "hostname": "gpu-node-02"}
        prometheus.targets[1] = replace(prometheus.targets[1], **down)  # type: ignore[arg-type]
        nodes = {node.name: node for node in source.read().nodes}
    # THEN it is down, with none of the GPUs read before
    assert nodes["gpu-node-02"].up is False and nodes["gpu-node-02"].snapshot is None
    assert nodes["gpu-node-01"].up is True


def test_a_target_without_gpus_scraped_between_two_reads_is_no_node() -> None:
    # GIVEN Prometheus scraping a gpuwatch daemon and a machine's node_exporter
    other = FakeTarget("node", "10.0.2.1:9100", "node_load1 0.5\n")
    prometheus = FakePrometheus([gpuwatch_node(1), other])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        source.read()
        # WHEN both are scraped again and the fleet is read
        prometheus.targets = [replace(t, scraped_at=NOW - 1) for t in prometheus.targets]
        fleet = source.read()
    # THEN the fleet is the gpuwatch node alone
    assert [node.name for node in fleet.nodes] == ["gpu-node-01"]


@pytest.mark.parametrize(
    "names",
    [
        ["10.0.0.7:9400", "10.0.0.8:9400"],
        ["[::1]:9400", "gpu-01.example.org:9400", "a+b(c)|d$"],
        ['odd"name\\:1', "tab\there:2"],
    ],
)
def test_a_narrowed_selector_matches_exactly_its_targets(names: list[str]) -> None:
    # GIVEN targets' instance names, some with regular-expression or PromQL specials
    matcher = promql.instances(names)
    # WHEN the matcher's string is read as PromQL reads it, and matched as RE2 matches
    quoted = re.fullmatch(r'instance=~"((?:[^"\\]|\\.)*)"', matcher)
    assert quoted is not None
    pattern = re.compile(re.sub(r"\\(.)", r"\1", quoted[1]))
    # THEN it matches each of them and nothing that merely looks alike
    assert all(pattern.fullmatch(name) for name in names)
    assert not pattern.fullmatch(names[0].replace(":", "x", 1) + "0")
    assert not pattern.fullmatch("10x0.0.7:9400")


DEFAULT_REQUESTS = [
    Request(),
    Request(count=2),
    Request(min_free_bytes=40 << 30),
    Request(count=2, min_free_bytes=70 << 30, strategy=Strategy.PACK),
]


@pytest.mark.parametrize("request_", DEFAULT_REQUESTS, ids=["one", "two", "40GiB", "pack"])
def test_where_on_each_nodes_verdict_finds_the_fits_of_a_whole_read(request_: Request) -> None:
    # GIVEN five daemons that tell their verdict on each GPU (a GPU down, one MIG-enabled,
    # an exclusive lease and a shared one on each), three with every GPU's memory in use
    nodes = [with_verdicts(gpuwatch_node(n, full=n > 2)) for n in range(1, 6)]
    prometheus = FakePrometheus(nodes)
    with serving(prometheus) as url:
        # WHEN where reads their verdicts, for a request judged as the default one
        assert request_.judged_as_default
        source = PrometheusSource(url, clock=lambda: NOW, placement=True)
        available = source.read_available(needed_bytes(request_))
        asked = list(prometheus.asked)
        whole = PrometheusSource(url, clock=lambda: NOW, placement=True).read()
    # THEN it finds the same nodes, devices and free memory as a whole read, having
    # asked for no process, lease, limit or MIG series
    assert available is not None
    assert where(available, request_).fits == where(whole, request_).fits
    assert not [q for q in asked if re.search(r"process|lease|used|mig", q)]


def test_a_daemon_that_tells_no_verdict_has_where_read_as_before() -> None:
    # GIVEN a daemon that tells its verdicts and one of a version that does not
    nodes = [with_verdicts(gpuwatch_node(1)), gpuwatch_node(2)]
    with serving(FakePrometheus(nodes)) as url:
        # WHEN where reads the verdicts
        available = PrometheusSource(url, clock=lambda: NOW, placement=True).read_available(0)
    # THEN it is told to read the fleet as it did before
    assert available is None


TABLE_FIGURES = (
    "gpus",
    "gpus_free",
    "most_free_bytes",
    "memory_free_bytes",
    "utilization_pct",
    "hottest_c",
    "power_w",
    "leases",
    "lease_waiters",
    "jobs",
)


def test_the_table_read_as_each_nodes_figures_is_the_table_read_gpu_by_gpu() -> None:
    # GIVEN five daemons that export their node's figures (a GPU down, one MIG-enabled,
    # an exclusive lease and a shared one on each), three with every GPU's memory in use
    nodes = [with_node_figures(gpuwatch_node(n, full=n > 2)) for n in range(1, 6)]
    prometheus = FakePrometheus(nodes)
    with serving(prometheus) as url:
        # WHEN the fleet table's source reads them, and a source reads every GPU
        source = PrometheusSource(url, clock=lambda: NOW, per_node=True)
        figures = source.read()
        asked = list(prometheus.asked)
        gpus = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN it read figures, one series per node (but what only Prometheus computes, every
    # fifth read), and the table shows what every GPU says
    assert source.summarized
    assert all(node.summary is not None and node.snapshot is None for node in figures.nodes)
    slow = {q.promql() for q in summaries.slow_plan(recorded=False)}
    per_gpu = re.compile(r"gpuwatch_(memory|utilization|temperature|power)_")
    assert not [q for q in asked if q not in slow and per_gpu.search(q)]

    def table(fleet: FleetState) -> list[tuple[object, ...]]:
        return [tuple(getattr(r, n) for n in TABLE_FIGURES) for r in build_rows(fleet)]

    assert table(figures) == table(gpus)
    assert len({row.most_free_bytes for row in build_rows(figures)}) == 2  # full, or not


def test_a_daemon_that_exports_no_figures_has_the_table_read_gpu_by_gpu() -> None:
    # GIVEN a daemon that exports its node's figures and one of a version that does not
    nodes = [with_node_figures(gpuwatch_node(1)), gpuwatch_node(2)]
    with serving(FakePrometheus(nodes)) as url:
        # WHEN the fleet table's source reads them, twice
        source = PrometheusSource(url, clock=lambda: NOW, per_node=True)
        first, second = source.read(), source.read()
    # THEN both nodes come GPU by GPU, from the first read on
    assert not source.summarized
    for fleet in (first, second):
        assert [n.name for n in fleet.nodes if n.snapshot is not None] == [
            "gpu-node-01",
            "gpu-node-02",
        ]
