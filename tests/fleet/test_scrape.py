"""Scraping nodes directly: every node at once, each within its own timeout; a node that
hangs, refuses, drips or sends the wrong thing is down with why, and never hides the others."""

from __future__ import annotations

import gzip
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.errors import InvalidValueError
from gpuwatch.fleet import fetch
from gpuwatch.fleet.config import read_nodes_file
from gpuwatch.fleet.scrape import ScrapeSource, parse_target
from gpuwatch.fleet_model import Exporter, FleetState
from tests.helpers.daemon import running_daemon
from tests.helpers.fleet.endpoints import Endpoint, hanging
from tests.helpers.fleet.net import free_port
from tests.helpers.fleet.servers import Reply, always, fixture, serving

DCGM = Reply(fixture("dcgm_node.prom"))
GZIP = {"Content-Encoding": "gzip"}


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("node1", "http://node1:19400/metrics"),
        ("node1:9400", "http://node1:9400/metrics"),
        ("[fd00::1]:9400", "http://[fd00::1]:9400/metrics"),
        ("http://node1", "http://node1:80/metrics"),
        ("https://node1:8443/gpu/metrics", "https://node1:8443/gpu/metrics"),
    ],
    ids=["host", "host-port", "ipv6", "url-default-port", "url-with-path"],
)
def test_a_node_is_a_host_a_port_or_a_url(text: str, url: str) -> None:
    assert parse_target(text).url == url


def test_a_bare_host_is_https_when_tls_is_configured() -> None:
    assert parse_target("node1", https=True).url == "https://node1:19400/metrics"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no de",
        "node\x1b[2J",
        "ftp://node1",
        "node1:99999",
        "node1:http",
        "alice:pw@node1",
        "http://alice:pw@node1",
        "-rf",
        "http://[::1",
    ],
    ids=[
        "empty",
        "space",
        "control",
        "ftp",
        "port-range",
        "port-name",
        "credentials",
        "url-credentials",
        "dash",
        "ipv6-unclosed",
    ],
)
def test_a_node_that_is_not_a_host_is_refused_in_one_printable_line(text: str) -> None:
    with pytest.raises(InvalidValueError) as raised:
        parse_target(text)
    message = str(raised.value)
    assert "\n" not in message and message.isprintable()
    assert "pw" not in message


def test_a_nodes_file_takes_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "nodes"
    path.write_text("# the lab\nnode1\n\n  node2:9400  # dcgm\nhttps://node3:8443/metrics\n")
    assert [t.url for t in read_nodes_file(str(path))] == [
        "http://node1:19400/metrics",
        "http://node2:9400/metrics",
        "https://node3:8443/metrics",
    ]


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ("node1\nnode 2\n", ":2:"),
        ("node1\n\x00\x01garbage\n", ":2:"),
        ("# only comments\n", "names no node"),
    ],
    ids=["space-in-line", "binary", "no-node"],
)
def test_a_nodes_file_with_garbage_names_the_line(tmp_path: Path, content: str, where: str) -> None:
    path = tmp_path / "nodes"
    path.write_text(content)
    with pytest.raises(InvalidValueError, match=where) as raised:
        read_nodes_file(str(path))
    assert str(path) in str(raised.value)


def test_a_missing_nodes_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match=r"nodes file .*No such file"):
        read_nodes_file(str(tmp_path / "absent"))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (os.mkfifo, "not a regular file"),
        (lambda path: path.symlink_to("/dev/zero"), "not a regular file"),
        (lambda path: path.write_text("node1\n" * (1 << 18)), "larger than 1MiB"),
    ],
    ids=["fifo", "device", "over-1MiB"],
)
def test_a_nodes_file_that_cannot_be_read_whole_is_refused_at_once(
    tmp_path: Path, make: Callable[[Path], object], says: str
) -> None:
    # GIVEN a FIFO nobody writes to, a device (an endless one), or a file past the cap
    path = tmp_path / "nodes"
    make(path)
    # WHEN it is read THEN it is refused in one line naming it, never read in part
    with pytest.raises(InvalidValueError) as refused:
        read_nodes_file(str(path))
    assert str(refused.value) == f"nodes file {path}: {says}"


def read(*targets: str, timeout_s: float = 2.0, **options: float) -> FleetState:
    return ScrapeSource(list(targets), timeout_s=timeout_s, **options).read()  # type: ignore[arg-type]


def test_a_real_daemon_scraped_is_a_node_up_with_its_gpus(tmp_path: Path) -> None:
    # GIVEN a gpuwatch daemon serving /metrics on loopback
    port = free_port()
    with running_daemon(tmp_path, "--listen", f"127.0.0.1:{port}"):
        # WHEN it is scraped
        fleet = read(f"127.0.0.1:{port}")
    # THEN it is a node named by its host name, with its GPUs and processes
    (node,) = fleet.nodes
    assert (node.name, node.up, node.exporter) == ("daemon-node", True, Exporter.GPUWATCH)
    assert node.snapshot is not None and len(node.snapshot.gpus) == 3
    assert [p.user for p in node.snapshot.processes] == ["alice"]
    assert node.leases == ()
    # AND its line of waiting jobs, empty; its Slurm jobs unknown (it reads no Slurm)
    assert (node.lease_waiters, node.longest_wait_s, node.jobs) == (0, 0.0, None)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(b"<html><body>Grafana</body></html>", content_type="text/html"), "no GPU metrics"),
        (Reply(b"not found", status=404), "HTTP 404"),
        (Reply(b"", status=401), "credentials"),
        (Reply(b"x" * 10_000, drip_s=0.01), "within"),
        (Reply(b"", endless_bytes=200 << 20), "too large"),
        (Reply(gzip.compress(b"0" * (20 << 20)), headers=GZIP), "too large"),
        (Reply(b"not gzip at all", headers=GZIP), "gzip"),
    ],
    ids=["html", "404", "401", "slow-drip", "huge-body", "gzip-bomb", "not-gzip"],
)
def test_a_node_that_answers_wrong_is_down_and_the_others_are_not(reply: Reply, error: str) -> None:
    with serving(always(DCGM)) as good, serving(always(reply)) as bad:
        fleet = read(good, bad, timeout_s=1.0, max_bytes=1 << 20)
    by_name = {node.name: node for node in fleet.nodes}
    assert by_name["dgx-a100-03"].up
    broken = by_name[bad]
    assert broken.up is False and broken.snapshot is None
    assert broken.error is not None and error in broken.error


def test_a_gzipped_answer_is_read_as_its_text() -> None:
    # GIVEN a node that answers gzipped, as exporters do when asked
    with serving(always(Reply(gzip.compress(DCGM.body), headers=GZIP))) as url:
        # WHEN it is read THEN it is up with its GPUs
        (node,) = read(f"{url}/metrics").nodes
    assert node.up and node.snapshot is not None and len(node.snapshot.gpus) == 2


def test_more_nodes_than_threads_are_all_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN five nodes and requests that may run two at a time
    monkeypatch.setattr(fetch, "MAX_THREADS", 2)

    def route(path: str, headers: dict[str, str]) -> Reply:
        name = path.split("/")[1]
        return Reply(fixture("dcgm_node.prom").replace(b"dgx-a100-03", name.encode()))

    with serving(route) as base:
        # WHEN they are read THEN every one is up
        fleet = read(*(f"{base}/node{n}/metrics" for n in range(5)))
    assert [(node.name, node.up) for node in fleet.nodes] == [(f"node{n}", True) for n in range(5)]


def test_a_refused_node_is_down_with_why_naming_the_port(refusing_endpoint: Endpoint) -> None:
    target = refusing_endpoint.address
    (node,) = read(target).nodes
    assert (node.name, node.up, node.error) == (target, False, f"connection refused at {target}")


@pytest.mark.slow
def test_twenty_nodes_some_hung_some_dripping_answer_within_one_timeout() -> None:
    # GIVEN 14 nodes that answer, 3 that accept and never answer, 3 that drip
    timeout_s = 3.0

    def route(path: str, headers: dict[str, str]) -> Reply:
        if path.startswith("/drip"):
            return Reply(b"y" * 10_000, drip_s=0.05)
        name = path.split("/")[1]
        return Reply(fixture("dcgm_node.prom").replace(b"dgx-a100-03", name.encode()))

    with serving(route) as base, hanging() as h1, hanging() as h2, hanging() as h3:
        targets = [f"{base}/node{i:02}/metrics" for i in range(14)]
        targets += [h.address for h in (h1, h2, h3)] + [f"{base}/drip{i}/metrics" for i in range(3)]
        # WHEN all are read
        started = time.monotonic()
        fleet = read(*targets, timeout_s=timeout_s)
        elapsed_s = time.monotonic() - started
    # THEN the bad ones cost one timeout together, not one each (six would be 18s)
    assert elapsed_s < 2 * timeout_s
    up = [node.name for node in fleet.nodes if node.up]
    assert up == [f"node{i:02}" for i in range(14)]
    down = [node for node in fleet.nodes if not node.up]
    assert len(down) == 6 and all(node.error for node in down)
