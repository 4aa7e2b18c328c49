"""A fleet read from a Prometheus HTTP API: one round of a fixed number of queries whatever
the fleet's size, narrowed to what the reader needs; every target a node, up or not;
staleness judged from the data's own times; a server that is not Prometheus one clear
SourceError."""

from __future__ import annotations

import dataclasses
import json
import re
import threading

import pytest
from msgspec.structs import replace

from gpuwatch.errors import InvalidValueError, SourceError
from gpuwatch.fleet import promql, summaries
from gpuwatch.fleet.exposition import parse_exposition
from gpuwatch.fleet.prometheus import PrometheusSource
from gpuwatch.fleet.series import PREFIXES, target_state
from gpuwatch.fleet.source import Needs
from gpuwatch.fleet_model import Exporter, FleetState
from gpuwatch.placement.where import Answer as WhereAnswer
from gpuwatch.placement.where import needs_of, where
from gpuwatch.request import Request
from gpuwatch.tui.fleet.rows import build_rows
from tests.helpers.fleet.endpoints import Endpoint
from tests.helpers.fleet.fakeprom import (
    NOW,
    FakePrometheus,
    FakeTarget,
    targets_of_answers,
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
    # THEN each refresh sends the same queries, each once, whatever the fleet's size: one
    # round, for every exporter the fleet might run (no round to find out first)
    assert one == forty
    first, later = one
    assert first == later and len(set(first)) == len(first)
    assert any("DCGM_FI_" in q for q in first) and any("nvidia_smi_" in q for q in first)


def test_a_target_prometheus_cannot_scrape_is_down_under_its_last_name() -> None:
    gone = FakeTarget("gpuwatch", "10.0.0.7:19400", "", up=False, hostname="gpu-node-07")
    gone.snapshot_at = NOW - 90
    gone.last_error = "server returned HTTP status 401 Unauthorized\x1b[2J"
    prometheus = FakePrometheus([dcgm_node(1), gone])
    with serving(prometheus) as url:
        fleet = PrometheusSource(url).read()
    by_name = {node.name: node for node in fleet.nodes}
    node = by_name["gpu-node-07"]
    assert node.up is False and node.snapshot is None
    assert node.age_at(fleet.taken_at) == pytest.approx(90)
    assert node.error is not None and "10.0.0.7:19400" in node.error
    # AND it says why, as Prometheus does, printable
    assert node.error.endswith("401 Unauthorized\\x1b[2J")
    assert (node.target, node.job) == ("10.0.0.7:19400", "gpuwatch")


def test_targets_never_up_are_nodes_down_with_why_and_others_no_nodes() -> None:
    # GIVEN a job of gpuwatch daemons, two of which Prometheus never could scrape, and a
    # machine's node_exporter in a job of its own
    up = gpuwatch_node(1)
    never = [
        FakeTarget("gpuwatch", f"10.0.1.{n}:9400", "", up=False, last_error="connection refused")
        for n in (8, 9)
    ]
    other = FakeTarget("node", "10.0.2.1:9100", "node_load1 0.5\n")
    prometheus = FakePrometheus([up, *never, other])
    with serving(prometheus) as url:
        # WHEN the fleet is read, and read for where (which asks no reasons)
        fleet = PrometheusSource(url, clock=lambda: NOW).read()
        asked = len(prometheus.asked)
        placed = PrometheusSource(url, clock=lambda: NOW, needs=needs_of(Request())).read()
    # THEN every target of the job is a node, those never up down with Prometheus's reason
    assert [(n.label, n.up) for n in fleet.nodes] == [
        ("10.0.1.8:9400", False),
        ("10.0.1.9:9400", False),
        ("gpu-node-01", True),
    ]
    assert all(n.error and n.error.endswith(": connection refused") for n in fleet.nodes[:2])
    assert prometheus.asked[:asked].count("targets") == 1
    # AND where's read counts them too, without asking why
    assert [n.up for n in placed.nodes] == [False, False, True]
    assert "targets" not in prometheus.asked[asked:]


def test_two_targets_that_claim_one_name_are_two_nodes() -> None:
    # GIVEN two daemons given one --node-name, and a node naming itself after them
    twins = [dataclasses.replace(gpuwatch_node(1), instance=f"10.0.1.{n}:9400") for n in (1, 2)]
    prometheus = FakePrometheus(twins)
    with serving(prometheus) as url:
        # WHEN the fleet is read
        fleet = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN each is a node, marked, and labelled by its target
    assert [(n.name, n.claims, n.label) for n in fleet.nodes] == [
        ("gpu-node-01", 2, "gpu-node-01@10.0.1.1:9400"),
        ("gpu-node-01", 2, "gpu-node-01@10.0.1.2:9400"),
    ]


def test_a_node_whose_last_scrape_is_old_is_stale_not_current() -> None:
    old = dcgm_node(2, scraped_at=NOW - 600)
    prometheus = FakePrometheus([dcgm_node(1), old])
    with serving(prometheus) as url:
        fleet = PrometheusSource(url, stale_after_s=120).read()
    stale = {node.name: node for node in fleet.nodes}["dgx-002"]
    assert stale.up is False
    assert stale.age_at(fleet.taken_at) == pytest.approx(600)
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


_VECTOR = b'{"status": "success", "data": {"resultType": "vector", "result": [%s]}}'


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
        (Reply(_VECTOR % b'{"metric": {"gpu": 0}, "value": [1, "2"]}'), "not of the API's shape"),
        (Reply(b"", status=401), "credentials"),
        (Reply(b"", endless_bytes=100 << 20, content_type="application/json"), "too large"),
        (Reply(b"{" * 10_000, drip_s=0.01, content_type="application/json"), "within 1s"),
    ],
    ids=[
        "html",
        "404",
        "status-error",
        "not-json",
        "json-list",
        "matrix",
        "label-not-text",
        "401",
        "100MB",
        "drip",
    ],
)
def test_a_server_that_is_not_prometheus_is_one_clear_line(reply: Reply, says: str) -> None:
    with serving(always(reply)) as url:
        source = PrometheusSource(url, timeout_s=1.0 if reply.drip_s else 10.0)
        with pytest.raises(SourceError) as raised:
            source.read()
    message = str(raised.value)
    assert says in message and url in message
    assert message.isprintable()


def test_series_without_a_finite_value_are_left_out_and_the_others_kept() -> None:
    # GIVEN an answer of four series, two of them NaN and +Inf, one not a number
    series = [
        b'{"metric": {"gpu": "0"}, "value": [1795472800.5, "NaN"]}',
        b'{"metric": {"gpu": "1"}, "value": [1795472800.5, "+Inf"]}',
        b'{"metric": {"gpu": "2"}, "value": [1795472800.5, "lots"]}',
        b'{"metric": {"gpu": "3"}, "value": [1795472800.5, "4.5e9"]}',
    ]
    with serving(always(Reply(_VECTOR % b", ".join(series)))) as url:
        # WHEN it is read
        ((evaluated, samples),) = PrometheusSource(url).client.samples(["x"], ["x"])
    # THEN only the finite one is a sample, with its evaluation time
    assert [(s.labels["gpu"], s.value) for s in samples] == [("3", 4.5e9)]
    assert evaluated == 1795472800.5


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


def gpuwatch_node(number: int, *, full: bool = False, idle: bool = False) -> FakeTarget:
    """The fixture's daemon as node `gpu-node-NN`; `full`: every GPU's memory in use;
    `idle`: no lease, process or load on any GPU (GPUs 0 and 1 free, 2 split, 3 down)."""
    text = GPUWATCH.replace("gpu-node-07", f"gpu-node-{number:02}")
    changes = (("memory_used_bytes", 8.0e10), ("memory_free_bytes", 1.0e9)) if full else ()
    if idle:
        changes = (("memory_used_bytes", 0.0), ("utilization_ratio", 0.0), ("leases", 0.0))
        text = re.sub(r"^gpuwatch_process_memory_bytes.*\n", "", text, flags=re.MULTILINE)
    for family, value in changes:
        line = rf"^(gpuwatch_{family}\{{.*\}}) .*$"
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
        needs = Needs(placement=True, mig=True)
        placed = PrometheusSource(url, clock=lambda: NOW, needs=needs).read()
        asked = list(prometheus.asked)
        shown = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN placement asks no temperature or power (dcgm-exporter's devices are seen in
    # any family, values asked of none), and sees the same memory, leases, MIG
    values = [q for q in asked if q != promql.DCGM_DEVICES.promql()]
    assert not [q for q in values if re.search("temperature|power|TEMP|POWER", q)]
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


PLACED_REQUESTS = [
    Request(),
    Request(count=2, min_free_bytes=40 << 30),
    Request(mem_bytes=10 << 30),
    Request(mem_bytes=60 << 30),
    Request(min_free_bytes=20 << 30, max_util_pct=50, allow_busy=True),
    Request(count=3, allow_busy=True),
    Request(mig="1g.10gb"),
]
PLACED_IDS = ["idle-gpu", "two-with-40GiB", "mem-10GiB", "mem-60GiB", "max-util-50", "three", "mig"]


def placed_and_whole(
    targets: list[FakeTarget], request: Request
) -> tuple[FleetState, FleetState, list[str]]:
    """The fleet read for where's `request`, and read whole; the queries of the first."""
    prometheus = FakePrometheus(targets)
    with serving(prometheus) as url:
        placed = PrometheusSource(url, clock=lambda: NOW, needs=needs_of(request)).read()
        asked = list(prometheus.asked)
        whole = PrometheusSource(url, clock=lambda: NOW).read()
    return placed, whole, asked


@pytest.mark.parametrize("request_", PLACED_REQUESTS, ids=PLACED_IDS)
@pytest.mark.parametrize("verdicts", [True, False], ids=["verdicts", "older-daemons"])
def test_a_read_for_where_gives_the_fits_of_a_whole_read(request_: Request, verdicts: bool) -> None:
    # GIVEN five gpuwatch daemons (a GPU down, one MIG-enabled, an exclusive lease and a
    # shared one with declared memory on each), three with every GPU's memory in use, one
    # with nothing running, that tell their verdict on each GPU or not (a version before),
    # and a dcgm-exporter node
    nodes = [gpuwatch_node(n, full=n > 2, idle=n == 1) for n in range(1, 6)]
    nodes = [with_verdicts(node) for node in nodes] if verdicts else nodes
    # WHEN where's read of it, narrowed to its request, and a whole read are placed on
    placed, whole, _ = placed_and_whole([*nodes, dcgm_node(9)], request_)
    assert where(whole, request_).fits or request_.count == 3 or request_.mig
    # THEN both find the same nodes and devices, with the same free memory; read GPU by
    # GPU, the nodes that do not fit are explained alike
    answer, whole_answer = where(placed, request_), where(whole, request_)
    assert chosen(answer) == chosen(whole_answer)
    if not verdicts or not request_.judged_as_default:
        assert answer.misses == whole_answer.misses


def chosen(answer: WhereAnswer) -> list[tuple[str, list[str | None], tuple[int, ...]]]:
    """Each fit's node, devices and their free memory (not what else the read told)."""
    return [(f.node, [d.uuid for d in f.devices], f.free_bytes) for f in answer.fits]


def test_a_read_for_where_is_one_round_of_the_same_queries_for_two_nodes_or_thirty() -> None:
    # GIVEN Prometheus scraping two gpuwatch daemons, or thirty
    request = Request(count=2, min_free_bytes=40 << 30)
    two = placed_and_whole([with_verdicts(gpuwatch_node(n)) for n in (1, 2)], request)[2]
    thirty = placed_and_whole([with_verdicts(gpuwatch_node(n)) for n in range(1, 31)], request)[2]
    # WHEN each fleet is read for where
    # THEN both send the same queries, each once: one round of names, targets, the
    # daemons' verdicts, and other exporters' families; no process, lease or GPU info
    assert sorted(two) == sorted(thirty)
    assert len(set(two)) == len(two)
    assert not [q for q in two if re.search(r"gpuwatch_(process|lease|gpu_info|mig)", q)]


def test_an_older_daemon_among_others_costs_one_round_more_narrowed_to_it() -> None:
    # GIVEN a daemon that tells its verdicts and one of a version that does not
    nodes = [with_verdicts(gpuwatch_node(1)), gpuwatch_node(2)]
    # WHEN where reads them at pick's default limits
    placed, whole, asked = placed_and_whole(nodes, Request())
    # THEN the second is read GPU by GPU, in queries narrowed to it alone
    older = promql.instances([nodes[1].instance])
    narrowed = [q for q in asked if older in q]
    assert narrowed and all("gpuwatch_" in q for q in narrowed)
    assert [n.offered is not None for n in placed.nodes] == [True, False]
    assert chosen(where(placed, Request())) == chosen(where(whole, Request()))


def family_queries(asked: list[str]) -> list[str]:
    """The queries of GPU series among `asked` (not names, `up` or scrape times)."""
    return [q for q in asked if "gpuwatch_" in q and not q.startswith("label_replace")]


def test_a_node_whose_scrape_fails_after_a_read_is_down_not_its_old_gpus() -> None:
    # GIVEN a source that has read two gpuwatch daemons
    prometheus = FakePrometheus([gpuwatch_node(1), gpuwatch_node(2)])
    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: NOW)
        source.read()
        # WHEN Prometheus's next scrape of the second fails
        down = {"up": False, "scraped_at": NOW - 1, "hostname": "gpu-node-02"}
        prometheus.targets[1] = dataclasses.replace(prometheus.targets[1], **down)  # type: ignore[arg-type]
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
        prometheus.targets = [
            dataclasses.replace(t, scraped_at=NOW - 1) for t in prometheus.targets
        ]
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
        source = PrometheusSource(url, clock=lambda: NOW, needs=Needs(per_node=True))
        figures = source.read()
        asked = list(prometheus.asked)
        gpus = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN it read figures, one series per node (but what only Prometheus computes, every
    # fifth read), and the table shows what every GPU says
    assert all(node.summary is not None and node.snapshot is None for node in figures.nodes)
    slow = {q.promql() for q in summaries.slow_plan(recorded=False)}
    per_gpu = re.compile(r"gpuwatch_(memory|utilization|temperature|power)_")
    assert not [q for q in asked if q not in slow and per_gpu.search(q)]

    def table(fleet: FleetState) -> list[tuple[object, ...]]:
        return [tuple(getattr(r, n) for n in TABLE_FIGURES) for r in build_rows(fleet)]

    assert table(figures) == table(gpus)
    assert len({row.most_free_bytes for row in build_rows(figures)}) == 2  # full, or not


def test_a_daemon_that_exports_no_figures_has_its_row_read_gpu_by_gpu() -> None:
    # GIVEN a daemon that exports its node's figures and one of a version that does not
    nodes = [with_node_figures(gpuwatch_node(1)), gpuwatch_node(2)]
    with serving(FakePrometheus(nodes)) as url:
        # WHEN the fleet table's source reads them, twice
        source = PrometheusSource(url, clock=lambda: NOW, needs=Needs(per_node=True))
        first, second = source.read(), source.read()
        gpus = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN the first comes as its figures, the second GPU by GPU, in every read
    for fleet in (first, second):
        assert [(n.summary is not None, n.snapshot is not None) for n in fleet.nodes] == [
            (True, False),
            (False, True),
        ]
        assert fleet.nodes[1].snapshot == gpus.nodes[1].snapshot


EKS_ANSWERS = [
    json.loads(fixture(f"recorded/prometheus-api-query_aicr_eks-h100x8_{family}.json"))
    for family in ("gpu-util", "fb-used", "gpu-temp", "power-usage")
]


def test_on_kubernetes_only_a_workload_pod_holds_a_gpu_not_the_exporters_own() -> None:
    # GIVEN the series a real Prometheus of an EKS cluster stored (NVIDIA/aicr's recorded
    # answers): two nodes of 8 H100, every series with the exporter pod's own pod,
    # namespace and container, but gpu 0 of gpu-node-1, which a vLLM pod holds
    with serving(FakePrometheus(targets_of_answers(*EKS_ANSWERS))) as url:
        # WHEN the fleet is read
        fleet = PrometheusSource(url, clock=lambda: NOW).read()
    # THEN each node is named by its host label, and only the vLLM pod holds a GPU
    assert [(n.name, n.target) for n in fleet.nodes] == [
        ("gpu-node-1", "10.0.172.246:9400"),
        ("gpu-node-2", "10.0.247.52:9400"),
    ]
    assert [len(n.snapshot.gpus) for n in fleet.nodes if n.snapshot] == [8, 8]
    pods = [(n.name, p.gpu_index, p.name, p.container) for n in fleet.nodes for p in n.pods]
    assert pods == [("gpu-node-1", 0, "dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5", "main")]


def table_source(url: str) -> PrometheusSource:
    return PrometheusSource(url, clock=lambda: NOW, needs=Needs(per_node=True))


def test_the_table_reads_again_only_the_figures_of_nodes_scraped_since() -> None:
    # GIVEN the table's source, having read two daemons that export their figures
    nodes = [with_node_figures(gpuwatch_node(n)) for n in (1, 2)]
    prometheus = FakePrometheus(nodes)
    with serving(prometheus) as url:
        source = table_source(url)
        source.read()
        asked = len(prometheus.asked)
        # WHEN Prometheus scrapes the second again (after that read was evaluated, at NOW),
        # finding its GPUs full, and it refreshes
        full = with_node_figures(gpuwatch_node(2, full=True))
        prometheus.targets[1] = dataclasses.replace(full, scraped_at=NOW + 1)
        refreshed = source.read()
        figures = [q for q in prometheus.asked[asked:] if "gpuwatch_node_gpus" in q]
        fresh = table_source(url).read()
    # THEN it asked the figures of the targets scraped since its last read only, and shows
    # what a source reading them all shows
    assert figures and all("scrape_duration_seconds > " in q for q in figures)
    rows = [(n.name, n.summary) for n in refreshed.nodes]
    assert rows == [(n.name, n.summary) for n in fresh.nodes]
    assert refreshed.nodes[1].summary != refreshed.nodes[0].summary


def test_a_node_scraped_while_a_refresh_is_answered_is_shown_as_one_scrape_left_it() -> None:
    # GIVEN the table's source, having read two daemons that export their figures
    nodes = [with_node_figures(gpuwatch_node(n)) for n in (1, 2)]
    prometheus = FakePrometheus(nodes)
    clock = [NOW]
    full = with_node_figures(gpuwatch_node(2, full=True))
    scraped = dataclasses.replace(full, scraped_at=NOW + 0.5, before=nodes[1])

    figures_answered = threading.Event()

    def store_the_scrape(query: str) -> None:
        if "gpuwatch_node_gpus" in query:
            prometheus.targets[1] = scraped
            figures_answered.set()

    def up_after_the_figures(query: str) -> None:
        if query == promql.UP_SEEN:
            figures_answered.wait(timeout=10)

    with serving(prometheus) as url:
        source = PrometheusSource(url, clock=lambda: clock[0], needs=Needs(per_node=True))
        before = source.read()
        # WHEN Prometheus stores a scrape of the second (begun at NOW + 0.5, its GPUs full)
        # just after it answered the query of the next refresh's node figures, while the
        # refresh's other queries (`up` among them) are still being answered; and then,
        # later, it refreshes
        prometheus.answered, prometheus.arriving = store_the_scrape, up_after_the_figures
        during = source.read()
        prometheus.answered = prometheus.arriving = None
        clock[0] = NOW + 2
        after = source.read()
        fresh = PrometheusSource(url, clock=lambda: NOW + 2, needs=Needs(per_node=True)).read()
    # THEN the refresh shows every node up, with its figures as one scrape left them (the
    # one before that scrape), and the next shows the new scrape's
    assert [(n.name, n.up, n.summary) for n in during.nodes] == [
        (n.name, n.up, n.summary) for n in before.nodes
    ]
    assert all(n.up for n in during.nodes)
    assert [(n.name, n.summary) for n in after.nodes] == [(n.name, n.summary) for n in fresh.nodes]
    assert after.nodes[1].summary != before.nodes[1].summary


def test_the_table_asks_names_and_why_nodes_are_down_only_when_they_may_have_changed() -> None:
    # GIVEN the table's source over a daemon and a target never up
    never = FakeTarget("gpuwatch", "10.0.1.9:9400", "", up=False, last_error="refused")
    prometheus = FakePrometheus([with_node_figures(gpuwatch_node(1)), never])
    with serving(prometheus) as url:
        source = table_source(url)
        # WHEN it refreshes three times, the fleet unchanged
        fleets = [source.read() for _ in range(3)]
    # THEN the names and the reasons were asked at the first refresh only, and every
    # refresh shows them
    assert prometheus.asked.count("targets") == 1
    assert sum(q == promql.names() for q in prometheus.asked) == 1
    for fleet in fleets:
        assert [(n.name, n.error and n.error.endswith(": refused")) for n in fleet.nodes] == [
            ("10.0.1.9:9400", True),
            ("gpu-node-01", None),
        ]


OTHER_TARGETS = {
    "daemons-only": [],
    "and-another-job": [FakeTarget("node", "10.0.2.1:9100", "node_load1 0.5\n")],
    "and-a-dcgm-exporter": [dcgm_node(3)],
}


@pytest.mark.parametrize("others", OTHER_TARGETS)
def test_a_steady_table_refresh_asks_up_the_figures_and_the_fleets_exporters_only(
    others: str,
) -> None:
    # GIVEN the table's source, having read daemons that export their figures (beside a
    # target of another job that exports no GPU, or a dcgm-exporter node)
    nodes = [with_node_figures(gpuwatch_node(n)) for n in (1, 2)]
    prometheus = FakePrometheus([*nodes, *OTHER_TARGETS[others]])
    with serving(prometheus) as url:
        source = table_source(url)
        source.read()
        asked = len(prometheus.asked)
        # WHEN it refreshes twice more, nothing slow being due
        source.read()
        source.read()
        refreshes = prometheus.asked[asked:]
    # THEN each refresh asked `up`, the figures and the families of the exporters the
    # fleet runs, nothing else: no names, no reasons, no other exporter's families
    with_dcgm = others == "and-a-dcgm-exporter"
    dcgm = promql.dcgm_values(placement=False) if with_dcgm else []
    assert len(refreshes) == 2 * (1 + len(summaries.plan()) + len(dcgm))
    assert promql.names() not in refreshes and "targets" not in refreshes
    assert not [q for q in refreshes if "nvidia_smi_" in q]
    assert any("DCGM_FI_" in q for q in refreshes) == with_dcgm
