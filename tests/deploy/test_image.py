"""The daemon's image, as deploy/container/build.sh builds it with no registry: it runs
`gpuwatch status`, its daemon serves /metrics, and it is configured as the Containerfile says.

Building takes about 5 minutes (debootstrap from a Debian mirror), too long for every run: set
GPUWATCH_BUILD_IMAGE=1 to build it once for the session, or GPUWATCH_IMAGE=TAG to test an image
built already. Needs root, buildah and debootstrap, and the mirror."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch._version import __version__
from tests.helpers.manifests import CONTAINER, daemon_container
from tests.helpers.other_user import as_user, other_user_ids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MIRROR = os.environ.get("GPUWATCH_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = os.environ.get("GPUWATCH_DEBIAN_SUITE", "bookworm")
# As build.sh: an OCI runtime refuses some hosts' cgroup set-ups; a chroot serves here.
ENV = {**os.environ, "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


def why_it_cannot_be_built() -> str | None:
    if os.geteuid() != 0:
        return "building the image needs root (debootstrap, buildah mount)"
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install buildah debootstrap)"
    try:
        urllib.request.urlopen(f"{MIRROR}/dists/{SUITE}/Release", timeout=10).close()
    except OSError as error:
        return f"the Debian mirror {MIRROR} cannot be reached: {error}"
    return None


def buildah(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", *args], capture_output=True, text=True, env=ENV, timeout=timeout_s, check=False
    )


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image under test: GPUWATCH_IMAGE, or one build.sh builds for this session."""
    if tag := os.environ.get("GPUWATCH_IMAGE"):
        if buildah("inspect", "--type", "image", tag).returncode != 0:
            pytest.fail(f"GPUWATCH_IMAGE={tag}: no such image here (buildah images lists them)")
        yield tag
        return
    if not os.environ.get("GPUWATCH_BUILD_IMAGE"):
        pytest.skip(
            "building the image takes about 5 minutes: set GPUWATCH_BUILD_IMAGE=1 to build it, "
            "or GPUWATCH_IMAGE=TAG to test one built already"
        )
    if reason := why_it_cannot_be_built():
        pytest.skip(reason)
    tag = f"localhost/gpuwatch-test:{__version__}"
    build = subprocess.run(
        [str(CONTAINER / "build.sh"), tag], capture_output=True, text=True, timeout=840, check=False
    )
    assert build.returncode == 0, build.stderr[-3000:]
    yield tag
    buildah("rmi", tag)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    made = buildah("from", "--pull-never", image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    yield name
    buildah("rm", name)


def test_status_in_the_image_shows_the_simulated_gpus(container: str) -> None:
    # WHEN `gpuwatch status --sim 2` runs in the image
    result = buildah("run", container, "--", "gpuwatch", "status", "--sim", "2")
    # THEN it shows two GPUs, as on any machine
    assert result.returncode == 0, result.stderr
    gpus = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("[")]
    assert gpus == ["[0]", "[1]"], result.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, deadline_s: float) -> str:
    """/metrics once the daemon has a first snapshot (sampling up); before that it answers
    with its own state only. What it answered last after deadline_s."""
    start, text = time.monotonic(), ""
    while time.monotonic() - start < deadline_s:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            pass
        if "\ngpuwatch_sampling_up 1.0" in text:
            break
        time.sleep(0.5)
    return text


def test_the_daemon_in_the_image_serves_metrics(container: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    # GIVEN the image's daemon on a simulated 2-GPU node, /metrics on a loopback port (a
    # chroot shares the host's network)
    port = free_port()
    argv = ["gpuwatch", "daemon", "--sim", "2", "--socket", "/tmp/gw.sock"]
    daemon = subprocess.Popen(
        ["buildah", "run", container, "--", *argv, "--listen", f"127.0.0.1:{port}"],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # WHEN Prometheus scrapes it
        text = scrape(f"http://127.0.0.1:{port}/metrics", deadline_s=60)
    finally:
        daemon.terminate()
        _, stderr = daemon.communicate(timeout=30)
    # THEN it serves both GPUs, up
    families = {family.name: family for family in text_string_to_metric_families(text)}
    up = {sample.labels["gpu"]: sample.value for sample in families["gpuwatch_gpu_up"].samples}
    assert up == {"0": 1.0, "1": 1.0}, stderr


def containerfile_settings() -> dict[str, str]:
    """The last stage's settings in the Containerfile: instruction -> its argument."""
    text = (CONTAINER / "Containerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("#")]
    last_stage = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    settings = {}
    for line in lines[last_stage + 1 :]:
        instruction, argument = line.split(" ", 1)
        settings[instruction] = argument
    return settings


def test_the_image_is_configured_as_the_containerfile_says(image: str) -> None:
    # GIVEN the image's configuration, and the Containerfile's
    inspected = buildah("inspect", "--type", "image", image)
    config = json.loads(inspected.stdout)["OCIv1"]["config"]
    settings = containerfile_settings()
    # THEN both build the same daemon image
    assert config["Entrypoint"] == json.loads(settings["ENTRYPOINT"])
    assert config["Cmd"] == json.loads(settings["CMD"])
    assert config["User"] == settings["USER"]
    assert list(config["ExposedPorts"]) == settings["EXPOSE"].split()
    assert settings["ENV"] in config["Env"]
    labels = dict(item.split("=", 1) for item in settings["LABEL"].split())
    assert labels.items() <= config["Labels"].items()
    # AND the user is the one the DaemonSet runs the daemon as
    security = daemon_container()["securityContext"]
    assert config["User"] == f"{security['runAsUser']}:{security['runAsGroup']}"


def test_build_sh_refuses_to_run_without_root_in_one_line(tmp_path: Path) -> None:
    # GIVEN an unprivileged user who can read this checkout (else a skip saying so)
    uid, gid = other_user_ids()
    # WHEN it runs build.sh THEN one line says why not
    result = subprocess.run(
        as_user(uid, gid, "bash", "-c", f"{CONTAINER / 'build.sh'}"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "build.sh: error: run as root (debootstrap and buildah mount need it)"
    ]
