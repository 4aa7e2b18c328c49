"""No escape sequence passes: OSC, CSI and C1 sequences, a lone ESC, BEL, DEL and a bidi
override in every text field a driver, a scenario, a remote node, an exporter, Prometheus,
Slurm or a lease file gives, through every screen: `status` (table and `--json`), `tui`,
the fleet's table, node view and users view, `where` and `job-report`.

The output is read as raw bytes (where no terminal is, only printable characters and new
lines; JSON carries the text as every screen shows it, with `?` for what would act, never
even escaped), and the screens run in a real terminal (tmux), where neither the window's
title nor the clipboard may change. Each field is found on its screen, harmlessly.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.daemon import get_json, running_daemon
from tests.helpers.fleet.prometheus import (
    Prometheus,
    PrometheusUnavailable,
    Target,
    running_prometheus,
)
from tests.helpers.fleet.servers import Reply, serving
from tests.helpers.hostile import (
    ACTING,
    clean_env,
    exporter_page,
    hostile,
    inert,
    scenario,
    shown,
    squeue_script,
    texts_of,
)
from tests.helpers.tmux import GPUWATCH, Tmux
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.timeout(300)
NODE_FIELDS = ("HOST", "DRIVER", "CUDA", "GPU0", "GPU1", "FAULT", "USER", "CMD")
"""The hostile texts of the scenario, as `status` shows each."""
needs_tmux = pytest.mark.skipif(
    subprocess.run(["which", "tmux"], capture_output=True, check=False).returncode != 0,
    reason="needs tmux (apt-get install tmux)",
)


def gpuwatch(env: dict[str, str], *args: str, exits: tuple[int, ...] = (0,)) -> tuple[str, bytes]:
    """What `gpuwatch ARGS` writes, stdout and stderr, which must hold nothing a terminal acts
    on; and its stdout as bytes. It must exit as told."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in exits, done.stderr.decode(errors="replace")
    return inert(done.stdout + done.stderr), done.stdout


def document_of(raw: bytes) -> object:
    """The JSON document of `raw`: plain bytes, and every string in it printable once read
    (so no control character was there as an escape, `\\u001b`, either)."""
    document = json.loads(inert(raw))
    assert all(text.isprintable() for text in texts_of(document))
    return document


def assert_found(text: str, *tags: str, cut: bool = False) -> None:
    """Each hostile field `tags` names is in `text`, shown harmlessly (`cut`: at least its
    first escape, where a screen's cell cuts it)."""
    missing = [tag for tag in tags if (f"{tag}?]" if cut else shown(tag)) not in text]
    assert not missing, f"{missing} not shown in:\n{text}"


@dataclass(frozen=True)
class Node:
    """A simulated node whose every text is hostile, with a lease whose command is too, on
    a Slurm node whose job's name and user are; read directly (`sim`) and through a daemon
    (`env`, which finds it)."""

    scenario: Path
    env: dict[str, str]
    socket: Path


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    home = tmp_path_factory.mktemp("hostile-node")
    env = clean_env(**_slurm(home), GPUWATCH_LEASE_DIR=str(home / "leases"))
    (home / "daemon").mkdir()
    args = ("--jobs", "slurm", "--jobs-refresh", "1s")
    with running_daemon(home / "daemon", *args, env=env, scenario=scenario()) as (_, sock, path):
        env["GPUWATCH_SOCKET"] = str(sock)
        wait_until(lambda: get_json(sock, "/v1/jobs")[1].get("jobs"), "the daemon to read Slurm")
        ready = home / "holding"
        held = [GPUWATCH, "pick", "--sim", str(path), "--", "sh", "-c", f"touch {ready}; sleep 600"]
        with subprocess.Popen([*held, hostile("LEASE")], env=env, start_new_session=True) as pick:
            try:
                wait_until(lambda: ready.exists() or pick.poll() is not None, "the lease")
                assert pick.poll() is None, "pick ended"
                yield Node(path, env, sock)
            finally:
                pick.kill()


def _slurm(home: Path) -> dict[str, str]:
    """A Slurm node `vm` whose squeue tells job 2 on GRES 0-1 (NVML GPUs 3 and 1)."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(squeue_script(sys.executable, time.time() - 600))
    (bin_dir / "squeue").chmod(0o755)
    (home / "slurm.conf").write_text("")
    (home / "gres.conf").write_text(f"Name=gpu File={home}/nvidia[7,5,6,4]\n")
    return {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "SLURM_CONF": str(home / "slurm.conf"),
        "SLURMD_NODENAME": "vm",
    }


@pytest.mark.slow
@pytest.mark.parametrize("read", ["scenario", "daemon"])
def test_status_shows_every_field_and_nothing_that_acts(node: Node, read: str) -> None:
    # GIVEN the node, read from its scenario file or through its daemon (with Slurm's jobs)
    sim = ["--sim", str(node.scenario)] if read == "scenario" else []
    # WHEN status prints its table
    text, _ = gpuwatch(node.env, "status", *sim)
    # THEN every field is there, its escapes as `?`, and nothing a terminal acts on
    assert_found(text, *NODE_FIELDS, "LEASE")
    if read == "daemon":
        assert_found(text, "JOBNAME", "JOBUSER")


@pytest.mark.slow
@pytest.mark.parametrize("read", ["scenario", "daemon"])
def test_status_json_carries_the_text_as_shown_not_even_escaped(node: Node, read: str) -> None:
    # GIVEN the node WHEN status prints JSON
    sim = ["--sim", str(node.scenario)] if read == "scenario" else []
    document = document_of(gpuwatch(node.env, "status", "--json", *sim)[1])
    # THEN the bytes are plain, every string printable, and each field says what the table
    # says
    assert_found(json.dumps(document), *NODE_FIELDS, "LEASE")
    if read == "daemon":
        assert_found(json.dumps(document), "JOBNAME", "JOBUSER")


@pytest.mark.slow
def test_job_report_shows_nothing_that_acts(node: Node) -> None:
    # GIVEN job 2 on GPUs 1 and 3, started before the daemon (exit 8: its history is shorter)
    report = ("job-report", "2", "--socket", str(node.socket))
    # WHEN its report is printed, and as JSON
    text, _ = gpuwatch(node.env, *report, exits=(8,))
    document = document_of(gpuwatch(node.env, *report, "--json", exits=(8,))[1])
    # THEN both name its GPUs, harmlessly
    assert_found(text, "GPU1")
    assert_found(json.dumps(document), "GPU1")


@pytest.mark.slow
@needs_tmux
def test_the_live_screen_neither_retitles_the_window_nor_writes_the_clipboard(
    node: Node, tmp_path: Path
) -> None:
    # GIVEN `gpuwatch tui` of the node, through its daemon, in a real terminal
    recorded = tmp_path / "bytes"
    command = f"{_exports(node.env)} {shlex.quote(GPUWATCH)} tui"
    terminal = Tmux(command, (400, 60), record=recorded)
    try:
        title = terminal.title()
        # WHEN it has drawn the node: its header, GPUs, processes, lease and job
        screen = terminal.wait_for(shown("DRIVER"))
        screen = terminal.wait_for("job 2 JOBU")  # the job's user, cut in its GPUs' cards
        # THEN every field is there, harmlessly, and the terminal is as it was
        fields = ("HOST", "DRIVER", "CUDA", "GPU0", "FAULT", "USER", "CMD", "LEASE")
        assert_found(screen, *fields, cut=True)
        assert terminal.title() == title and "PWNED" not in title
        assert terminal.buffers() == ""
        assert not [seq for seq in ACTING if seq in recorded.read_bytes()]
    finally:
        terminal.close()


def _exports(env: dict[str, str]) -> str:
    names = ("GPUWATCH_SOCKET", "GPUWATCH_LEASE_DIR", "PATH", "SLURM_CONF", "SLURMD_NODENAME")
    return "env " + " ".join(f"{name}={shlex.quote(env[name])}" for name in names)


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """A node's exporter whose every label is hostile: its `HOST:PORT`."""

    def route(path: str, headers: dict[str, str]) -> Reply:
        return Reply(exporter_page()) if path.startswith("/metrics") else Reply(status=404)

    with serving(route) as base:
        yield base.removeprefix("http://")


FLEET_FIELDS = ("GPU1", "USER", "JOBUSER")


def test_fleet_table_json_and_where_show_nothing_that_acts(exporter: str) -> None:
    env = clean_env()
    # WHEN the fleet's table, its JSON and `where` read the node
    table, _ = gpuwatch(env, "fleet", "--once", "--node", exporter)
    document = document_of(gpuwatch(env, "fleet", "--json", "--node", exporter)[1])
    where, _ = gpuwatch(env, "where", "--node", exporter, "-n", "1", exits=(4,))
    # THEN they name the node (escaped as names are), and the JSON every field, harmlessly
    assert "HOST\\x1b]0;PWNED" in table and "HOST\\x1b]0;PWNED" in where
    assert_found(json.dumps(document), "GPU0", "UUID0", "JOBID", "JOBUSER")


@pytest.fixture(scope="module")
def prometheus(exporter: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping the hostile exporter; a skip where it cannot run."""
    try:
        with running_prometheus(tmp_path_factory.mktemp("prometheus"), [Target(exporter)]) as p:
            p.wait_until_up([exporter])
            yield p
    except PrometheusUnavailable as error:
        pytest.skip(str(error).splitlines()[0])


@pytest.mark.slow
def test_fleet_through_prometheus_shows_nothing_that_acts(prometheus: Prometheus) -> None:
    env = clean_env()
    # WHEN the fleet's table and JSON read the node through Prometheus
    table, _ = gpuwatch(env, "fleet", "--once", "--prometheus", prometheus.url)
    document = document_of(gpuwatch(env, "fleet", "--json", "--prometheus", prometheus.url)[1])
    # THEN they show it as when scraped, harmlessly
    assert "HOST\\x1b]0;PWNED" in table
    assert_found(json.dumps(document), "GPU0", "JOBUSER")


@pytest.mark.slow
@needs_tmux
@pytest.mark.parametrize("through", ["node", "prometheus"])
def test_the_fleets_node_and_users_views_neither_retitle_nor_write_the_clipboard(
    exporter: str, through: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # GIVEN `gpuwatch fleet` of the hostile node, scraped or through Prometheus
    source = ["--node", exporter]
    if through == "prometheus":
        source = ["--prometheus", request.getfixturevalue("prometheus").url]
    recorded = tmp_path / "bytes"
    terminal = Tmux(shlex.join([GPUWATCH, "fleet", *source]), (400, 60), record=recorded)
    try:
        title = terminal.title()
        terminal.wait_for("HOST\\x1b]0;PWNED")
        # WHEN its node view opens: the header with the driver's versions, the GPUs' cards
        terminal.press("Enter")
        terminal.wait_for(shown("DRIVER"))
        assert_found(terminal.wait_for("JOBUSER?]"), "CUDA", "GPU0", "JOBID", cut=True)
        # AND, back on the table, its users view
        terminal.press("Escape")
        terminal.wait_for("FREE")
        terminal.press("u")
        assert_found(terminal.wait_for("USER?]"), "JOBUSER", cut=True)
        # THEN nothing reached the terminal that would act on it
        assert terminal.title() == title and "PWNED" not in title
        assert terminal.buffers() == ""
        assert not [seq for seq in ACTING if seq in recorded.read_bytes()]
    finally:
        terminal.close()


@needs_tmux
def test_the_terminal_checks_see_a_title_and_a_clipboard_write(tmp_path: Path) -> None:
    # GIVEN a program that writes the sequences itself, raw WHEN it runs in the terminal
    recorded = tmp_path / "bytes"
    write = f"import sys; sys.stdout.buffer.write({hostile('RAW').encode()!r})"
    command = shlex.join([sys.executable, "-c", write])
    terminal = Tmux(command, (80, 24), record=recorded)
    try:
        # THEN each check this module makes sees what it did
        wait_until(lambda: "PWNED" in terminal.title(), "the title to change")
        wait_until(terminal.buffers, "the clipboard to be written")
        wait_until(
            lambda: all(seq in recorded.read_bytes() for seq in ACTING), "the bytes recorded"
        )
    finally:
        terminal.close()
