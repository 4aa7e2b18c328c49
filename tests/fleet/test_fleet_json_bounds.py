"""`gpuwatch fleet --json` on fleets whose answers are large or slow to judge, as users run
the installed command: how much the answers may hold (`--max-bytes`), and `--timeout`
bounding the whole command, the work after the answers included."""

from __future__ import annotations

import gzip
import json
import subprocess
import urllib.parse

import pytest
from msgspec.structs import replace

from gpuwatch.backends.sim_fleet import SimFleet
from gpuwatch.cli.exit_codes import ExitCode
from gpuwatch.fleet import promql
from gpuwatch.fleet.document import document_text, fleet_document
from tests.helpers.fleet.servers import Reply, Route, serving
from tests.helpers.tmux import GPUWATCH

MIB = 1 << 20
EVALUATED_AT = 1_795_472_800.0
_EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
_NO_TARGETS = b'{"status":"success","data":{"activeTargets":[]}}'


def _prometheus(up_seen: bytes) -> Route:
    """A Prometheus that knows targets only by `up` and its time (`promql.UP_SEEN`,
    answered `up_seen`), and no series of theirs: every other query answers nothing."""

    def route(path: str, headers: dict[str, str]) -> Reply:
        url = urllib.parse.urlsplit(path)
        if url.path == "/api/v1/targets":
            return Reply(_NO_TARGETS, content_type="application/json")
        query = dict(urllib.parse.parse_qsl(url.query)).get("query")
        if query != promql.UP_SEEN:
            return Reply(_EMPTY, content_type="application/json")
        # gzip, as a Prometheus answers it: the cap counts the JSON, not what the wire carried
        headers = {"Content-Encoding": "gzip"}
        return Reply(up_seen, content_type="application/json", headers=headers)

    return route


def _up_seen(targets: list[dict[str, str]], scraped_at: float) -> bytes:
    """`timestamp(up) * (2 * up - 1)` for `targets` (their labels), gzipped: all scraped
    at `scraped_at`, negative where the scrape failed."""
    value = repr(scraped_at)
    result = [{"metric": labels, "value": [EVALUATED_AT, value]} for labels in targets]
    document = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return gzip.compress(json.dumps(document).encode(), compresslevel=1)


def _fleet_json(url: str, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [GPUWATCH, "fleet", "--json", "--prometheus", url, *options]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def _labelled_targets() -> list[dict[str, str]]:
    """Two targets whose labels (as Kubernetes service discovery gives a target many)
    make `up`'s answer 257 MiB: over the default cap of all of a read's answers."""
    return [
        {"job": "gpuwatch", "instance": "gpu-01:9400", "annotations": "x" * (257 * MIB)},
        {"job": "gpuwatch", "instance": "gpu-02:9400"},
    ]


def test_answers_over_the_default_cap_fail_in_one_line_naming_it() -> None:
    # GIVEN a Prometheus whose answers to one read hold 257 MiB
    with serving(_prometheus(_up_seen(_labelled_targets(), -EVALUATED_AT))) as url:
        # WHEN fleet --json reads it with the default cap
        done = _fleet_json(url)
    # THEN it exits 6 in one line that says the answers are too large and what to do, and
    # prints nothing
    assert done.returncode == ExitCode.REMOTE, done.stderr
    assert "answers too large (over 256MiB in all): a larger fleet needs --max-bytes" in (
        done.stderr
    )
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_max_bytes_lets_a_read_of_more_than_the_default_cap_through() -> None:
    # GIVEN the same Prometheus, 257 MiB of answers
    with serving(_prometheus(_up_seen(_labelled_targets(), -EVALUATED_AT))) as url:
        # WHEN fleet --json reads it allowed 300 MiB
        done = _fleet_json(url, "--max-bytes", "300MiB")
    # THEN it prints the document: both targets, down (their scrapes failed)
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)["nodes"]
    assert [(n["target"], n["up"]) for n in nodes] == [
        ("gpu-01:9400", False),
        ("gpu-02:9400", False),
    ]


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("lots", "'lots' is not a size"),
        ("64", "has no unit"),
        ("1KiB", "out of range: give 1MiB to 16GiB"),
        ("1TiB", "out of range: give 1MiB to 16GiB"),
    ],
    ids=["word", "no-unit", "too-small", "too-large"],
)
def test_a_bad_max_bytes_is_one_line_and_the_usage_exit_code(value: str, complaint: str) -> None:
    # WHEN the installed command is given a bad --max-bytes
    done = _fleet_json("http://127.0.0.1:9", "--max-bytes", value)
    # THEN it says what is wrong in one line, exit 2, before reading anything
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "'--max-bytes'" in done.stderr and complaint in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


def test_timeout_bounds_the_work_after_the_answers_too() -> None:
    # GIVEN a Prometheus that answers at once that 200,000 targets are down: 16 MiB of
    # answers (a tenth of a second), and seconds of work to judge them and build the
    # document (70 MiB)
    targets = [{"job": "gpuwatch", "instance": f"gpu-{n:06d}:9400"} for n in range(200_000)]
    with serving(_prometheus(_up_seen(targets, -EVALUATED_AT))) as url:
        # WHEN fleet --json reads it within 1 s in all
        done = _fleet_json(url, "--timeout", "1s")
    # THEN it stops at the timeout: exit 6 (as for answers too late), one line saying that
    # --timeout bounds the whole command, and no partial document
    assert done.returncode == ExitCode.REMOTE, done.stderr
    assert "not done within 1s (--timeout bounds the whole command" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


@pytest.mark.parametrize("nodes", [0, 1, 20], ids=["none", "one", "twenty"])
def test_the_document_written_a_node_at_a_time_is_the_whole_documents_text(nodes: int) -> None:
    # GIVEN a simulated fleet's state (down and stale nodes, dcgm-exporter's, leases)
    fleet = SimFleet(max(1, nodes)).read()
    if nodes == 0:
        fleet = replace(fleet, nodes=())
    # WHEN its document is written in pieces
    text = "".join(document_text(fleet))
    # THEN it is the whole document's JSON text, one line
    assert text == json.dumps(fleet_document(fleet), allow_nan=False) + "\n"
    assert len(json.loads(text)["nodes"]) == nodes
