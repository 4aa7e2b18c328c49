"""`gpuwatch where` as a user runs it: real daemons scraped over loopback, the answer
checked against each node's known free memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.cli import run_cli
from tests.helpers.fleet.daemons import SimNode
from tests.helpers.fleet.endpoints import Endpoint
from tests.helpers.fleet.prometheus import StartDaemons
from tests.helpers.fleet.servers import Reply, always, serving

pytestmark = pytest.mark.slow  # real daemons, one per node

GIB = 1 << 30
# Every simulated GPU is 30 % busy: the requests below take busy GPUs (--allow-busy).
NODES = (
    SimNode("node-a", (0, 0)),
    SimNode("node-b", (20 * GIB, 30 * GIB)),
    SimNode("node-c", (70 * GIB, 70 * GIB)),
)


@pytest.fixture
def fleet(start_daemons: StartDaemons) -> list[str]:
    """`--node ADDRESS` for each of the three nodes."""
    daemons = start_daemons(list(NODES))
    return [argument for daemon in daemons for argument in ("--node", daemon.address)]


def expected(count: int, min_free_bytes: int, *, pack: bool) -> list[str]:
    """The nodes with `count` GPUs of at least `min_free_bytes` free, best first: computed
    from what each simulated node holds, not by gpuwatch."""
    fits = {}
    for node in NODES:
        free = sorted((b for b in node.free_bytes() if b >= min_free_bytes), reverse=not pack)
        if len(free) >= count:
            fits[node.name] = sum(free[:count]) // GIB  # within a GiB counts as equal
    return sorted(fits, key=lambda name: (fits[name] if pack else -fits[name], name))


@pytest.mark.parametrize(
    ("arguments", "count", "min_free", "pack"),
    [
        (["-n", "1", "--min-free", "40GiB"], 1, 40 * GIB, False),
        (["-n", "1", "--min-free", "40GiB", "--strategy", "pack"], 1, 40 * GIB, True),
        (["-n", "2", "--min-free", "40GiB"], 2, 40 * GIB, False),
        (["-n", "2", "--min-free", "5GiB"], 2, 5 * GIB, False),
    ],
    ids=["one-most-free", "one-pack", "two-40", "two-5"],
)
def test_nodes_that_fit_come_best_first_with_the_node_name_first(
    fleet: list[str], arguments: list[str], count: int, min_free: int, pack: bool
) -> None:
    # GIVEN three nodes with known free memory WHEN where is asked
    result = run_cli("where", *arguments, "--allow-busy", *fleet)
    # THEN the nodes that fit are printed best first, the node's name as the first word
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines] == expected(count, min_free, pack=pack)
    assert all(line.count("GiB") == count for line in lines)


def test_json_lists_the_gpus_uuids_and_free_memory(fleet: list[str]) -> None:
    result = run_cli("where", "-n", "2", "--min-free", "40GiB", "--allow-busy", "--json", *fleet)
    assert result.exit_code == 0, result.stderr
    answers = json.loads(result.stdout)
    assert [answer["node"] for answer in answers] == expected(2, 40 * GIB, pack=False)
    answer = answers[0]
    assert sorted(answer["gpus"]) == [0, 1]
    assert all(uuid.startswith("GPU-") for uuid in answer["uuids"])
    assert all(free >= 40 * GIB for free in answer["memory_free_bytes"])
    assert answer["leases_known"] is True


def test_no_node_fits_exits_4_and_explains_the_closest(fleet: list[str]) -> None:
    # GIVEN node-a left out, node-b has one GPU with 55 GiB free and node-c none
    # WHEN two such GPUs are asked for
    result = run_cli(
        "where",
        "-n",
        "2",
        "--min-free",
        "55GiB",
        "--allow-busy",
        "--exclude-node",
        "node-a",
        *fleet,
    )
    # THEN where exits 4 and says for each node why not, closest first, GPU by GPU
    assert result.exit_code == ExitCode.NOT_ENOUGH_GPUS
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "gpuwatch: error: no node can run 2 GPUs with 55.0GiB free now (2 nodes, 0 down)"
    )
    assert lines[1] == "  node-b: 1 of 2 qualify"
    assert lines[2].startswith("    GPU 0: qualifies")
    assert lines[3].startswith("    GPU 1: ") and lines[3].endswith("< 55.0GiB")
    assert lines[4] == "  node-c: 0 of 2 qualify"


def test_a_node_that_could_never_serve_says_why(fleet: list[str]) -> None:
    result = run_cli("where", "-n", "3", "--allow-busy", *fleet)
    assert result.exit_code == ExitCode.NOT_ENOUGH_GPUS
    assert "  node-a: never: it has 2 GPUs" in result.stderr


def test_idle_gpus_only_by_default_as_pick(fleet: list[str]) -> None:
    # GIVEN every GPU is 30 % busy WHEN an exclusive GPU is asked for without --allow-busy
    result = run_cli("where", *fleet)
    # THEN none fits: each is in use, as pick would say
    assert result.exit_code == ExitCode.NOT_ENOUGH_GPUS
    assert "in use: 30% busy > 5% (default; see --max-util)" in result.stderr


def test_a_down_node_never_fits_and_v_says_so(
    fleet: list[str], refusing_endpoint: Endpoint
) -> None:
    result = run_cli("where", "--allow-busy", "-v", *fleet, "--node", refusing_endpoint.address)
    assert result.exit_code == 0
    assert refusing_endpoint.address not in result.stdout
    assert f"gpuwatch: {refusing_endpoint.address}: down: connection refused" in result.stderr


def test_excluded_nodes_and_limit(fleet: list[str]) -> None:
    result = run_cli("where", "--allow-busy", "--exclude-node", "node-a", "--limit", "1", *fleet)
    assert result.exit_code == 0, result.stderr
    assert [line.split(" ")[0] for line in result.stdout.splitlines()] == ["node-b"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--min-free", "40"], "Invalid value for '--min-free'"),
        (["-n", "two"], "Invalid value for '-n' / '--gpus'"),
        (["--prometheus", "ftp://prom:9090"], "give http(s)://HOST:PORT"),
        (["--nodes-file", "/nonexistent/nodes"], "/nonexistent/nodes"),
        (["--sim", "0"], "Invalid value for '--sim'"),
        (["stray"], "Got unexpected extra argument (stray)"),
        (["--no-such"], "No such option '--no-such'"),
    ],
    ids=["limit", "size-unit", "count", "url", "nodes-file", "sim", "stray", "unknown"],
)
def test_bad_input_is_one_line_and_exit_2(arguments: list[str], message: str) -> None:
    result = run_cli("where", *arguments)
    assert result.exit_code == ExitCode.USAGE
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_without_a_source_it_says_how_to_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GPUWATCH_PROMETHEUS", raising=False)
    result = run_cli("where")
    assert result.exit_code == ExitCode.USAGE
    assert "give --prometheus URL or --node HOST" in result.stderr


def test_a_prometheus_that_cannot_be_read_exits_6(refusing_endpoint: Endpoint) -> None:
    result = run_cli("where", "--prometheus", refusing_endpoint.url)
    assert result.exit_code == ExitCode.REMOTE
    assert len(result.stderr.splitlines()) == 1


def vector_of(size_bytes: int) -> bytes:
    """An instant query's answer of about `size_bytes`: a vector of one GPU's free memory
    over and over (built without a list of distinct series, which would cost the test's
    process several times the answer)."""
    series = (
        b'{"metric":{"__name__":"gpuwatch_memory_free_bytes","gpu":"0","instance":'
        b'"gpu-00001:19400","job":"gpuwatch"},"value":[1795472800.0,"85899345920"]}'
    )
    head, tail = b'{"status":"success","data":{"resultType":"vector","result":[', b"]}}"
    return head + b",".join([series] * (size_bytes // (len(series) + 1))) + tail


# Runs a command and prints its exit status and peak memory (KiB). A process of its own, so
# that the peak is the command's: a child forked from pytest itself would count pytest's.
PEAK_OF = (
    "import resource, subprocess, sys\n"
    "status = subprocess.run(sys.argv[1:], check=False).returncode\n"
    "print(status, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def test_a_prometheus_answering_60mib_a_query_costs_where_its_timeout_not_its_memory() -> None:
    # GIVEN a Prometheus stand-in that answers every query with 60 MiB of series
    answer = Reply(vector_of(60 << 20), content_type="application/json")
    with serving(always(answer)) as url:
        # WHEN where asks it, in a process of its own, with --timeout 5s
        where = [sys.executable, "-m", "gpuwatch", "where", "--prometheus", url, "--timeout", "5s"]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", PEAK_OF, *where], capture_output=True, text=True, check=True
        )
        took_s = time.monotonic() - started
    # THEN it exits 6 (the server cannot be read) in one line, within 6 s, in less memory
    # than the answers to its nine queries (540 MiB): its cap of 256 MiB and the interpreter
    status, peak_kib = map(int, done.stdout.split())
    assert status == ExitCode.REMOTE, done.stderr
    assert "too large" in done.stderr and len(done.stderr.splitlines()) == 1
    assert took_s < 6.0
    assert peak_kib * 1024 < 400_000_000
