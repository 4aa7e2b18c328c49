"""Real `gpuwatch daemon` processes on loopback, each serving one simulated node.

Each node is a `SimNode`: its name and the memory in use on each of its GPUs, so that a
test knows every GPU's free memory without asking gpuwatch (`SimNode.free_bytes`). Each
daemon has its own socket, lease directory and TCP port for `/metrics`; its series carry
`hostname="<name>"`: from `--node-name` where the daemon takes it (the simulated host
then has another name, as a container would), else from the scenario's host name.
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.backends.scenario import MODELS
from tests.helpers.fleet.net import fetch, free_port

GIB = 1 << 30
START_TIMEOUT_S = 90.0  # a loaded 2-core machine starts a few interpreters slowly


@dataclass(frozen=True)
class SimNode:
    """A simulated node: `used_bytes[i]` is held on GPU i by one process, constant, so its
    free memory is known in advance. The GPU count is `len(used_bytes)`."""

    name: str
    used_bytes: tuple[int, ...] = (0, 0)
    model: str = "H100-80GB"
    # Distinct per node by default: a GPU's uuid derives from the seed, and two nodes
    # with the same uuids would make a join on `uuid` lie.
    seed: int | None = None
    utilization_pct: int = 30

    def free_bytes(self) -> tuple[int, ...]:
        """Each GPU's free memory, as the simulator reports it (capacity less what is used)."""
        model = MODELS[self.model]
        capacity = model.memory_total_bytes - model.memory_reserved_bytes
        return tuple(capacity - min(used, capacity) for used in self.used_bytes)

    def scenario(self, hostname: str | None = None) -> str:
        """The scenario file; its host is named `hostname`, by default the node's name."""
        seed = _seed_of(self.name) if self.seed is None else self.seed
        lines = [f'hostname = "{hostname or self.name}"', f"seed = {seed}"]
        for _ in self.used_bytes:
            lines += ["[[gpu]]", f'model = "{self.model}"', 'load = "constant"']
            lines.append(f"utilization_pct = {self.utilization_pct}")
        for index, used in enumerate(self.used_bytes):
            if used:
                lines += ["[[process]]", f"gpu = {index}", f"pid = {1000 + index}"]
                lines += ['user = "alice"', f'memory = "{used // (1 << 20)}MiB"']
        return "\n".join(lines) + "\n"


@dataclass
class RunningDaemon:
    """One daemon: `address` (`127.0.0.1:PORT`) is its `/metrics` over TCP."""

    node: SimNode
    process: subprocess.Popen[bytes]
    port: int
    socket_path: Path
    lease_dir: Path
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    @property
    def env(self) -> dict[str, str]:
        """The environment under which a `gpuwatch` command works on this node (its
        daemon, its leases)."""
        return {"GPUWATCH_SOCKET": str(self.socket_path), "GPUWATCH_LEASE_DIR": str(self.lease_dir)}

    def kill(self) -> None:
        """The node goes down at once (SIGKILL): nothing answers on its port any more."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """A clean stop (SIGTERM)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@functools.cache
def daemon_accepts_node_name() -> bool:
    """Whether this version of `gpuwatch daemon` takes `--node-name`."""
    help_text = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "daemon", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return "--node-name" in help_text


@contextmanager
def running_daemons(
    tmp_path: Path, nodes: Sequence[SimNode], *, interval: str = "1s"
) -> Iterator[list[RunningDaemon]]:
    """Starts one daemon per node, all at once, and yields them once every one serves its
    GPUs on `/metrics`; stops those still running when the block ends."""
    with ExitStack() as stack:
        daemons = []
        for number, node in enumerate(nodes):
            # Two nodes may be given one name (as two daemons given one --node-name): each
            # has a home of its own all the same.
            named = [other.name for other in nodes[:number]].count(node.name)
            home = tmp_path / (f"{node.name}-{named}" if named else node.name)
            daemons.append(_start(home, node, interval))
            stack.callback(daemons[-1].stop)
        for number, daemon in enumerate(daemons):
            daemons[number] = _until_serving(daemon, interval)
            stack.callback(daemons[number].stop)  # a restarted one replaced the first
        yield daemons


def _start(home: Path, node: SimNode, interval: str) -> RunningDaemon:
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [sys.executable, "-m", "gpuwatch", "daemon", "--sim", str(home / "node.toml")]
    argv += ["--socket", str(home / "gw.sock"), "--listen", f"127.0.0.1:{port}"]
    argv += ["--interval", interval]
    if daemon_accepts_node_name():
        # The simulated host gets another name, as a container's would: the series must
        # carry the node's name all the same.
        argv += ["--node-name", node.name]
        (home / "node.toml").write_text(node.scenario(hostname=f"container-{node.name}"))
    else:
        (home / "node.toml").write_text(node.scenario())
    env = {**os.environ, "GPUWATCH_LEASE_DIR": str(home / "leases")}
    for name in ("GPUWATCH_SIM", "GPUWATCH_BACKEND", "GPUWATCH_NODE_NAME"):
        env.pop(name, None)
    log_path = home / "daemon.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    return RunningDaemon(node, process, port, home / "gw.sock", home / "leases", log_path)


def _until_serving(daemon: RunningDaemon, interval: str) -> RunningDaemon:
    """The daemon once it serves; one restart on another port when the port it was given
    was taken in between (another test's server got it first)."""
    if _serves(daemon):
        return daemon
    if "cannot serve metrics" in daemon.log():
        daemon = _start(daemon.socket_path.parent, daemon.node, interval)
        if _serves(daemon):
            return daemon
    daemon.stop()
    raise AssertionError(f"the daemon of {daemon.node.name} did not serve:\n{daemon.log()}")


def _serves(daemon: RunningDaemon) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and daemon.process.poll() is None:
        if b"gpuwatch_memory_free_bytes{" in fetch(daemon.url, timeout_s=5):
            return True
        time.sleep(0.05)
    return False


def _seed_of(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
