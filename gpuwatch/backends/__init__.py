"""Where snapshots come from: the `Backend` interface and `open_backend()`.

- `daemon`: the latest snapshot of a running `gpuwatch daemon`, over its socket.
- `nvml`: the GPUs of this machine, through the NVIDIA driver.
- `sim`: a simulated node (`--sim 4`, or `--sim scenario.toml`).

`auto`, the default, asks the daemon and falls back to the driver.

Each backend is opened through a small registry (`BACKENDS`, name → where it is defined),
as click's lazy group opens commands: a command loads the one it reads, never the others
(the simulator and its scenario parser load only for `--sim`; pynvml, imported with the
NVML backend, only where the driver is read: on a machine without the NVIDIA library
`open_backend()` says so without paying to import the bindings).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from gpuwatch.backends.base import Backend, SampleScope
from gpuwatch.errors import DaemonUnavailableError, InvalidValueError
from gpuwatch.models import Lease, Snapshot
from gpuwatch.paths import socket_candidates

__all__ = [
    "BACKENDS",
    "BACKEND_KINDS",
    "Backend",
    "SampleScope",
    "open_backend",
    "remote_snapshots",
]

BACKENDS = {
    "auto": "gpuwatch.backends.auto:AutoBackend",
    "daemon": "gpuwatch.backends.daemon_client:DaemonBackend",
    "nvml": "gpuwatch.backends.nvml:NvmlBackend",
    "sim": "gpuwatch.backends.sim:SimBackend",
}
"""Every backend: its name, and where it is defined (`module:name`)."""
BACKEND_KINDS = tuple(BACKENDS)
DRIVER = "gpuwatch.backends.driver:open_driver"
"""This machine's GPUs through the driver, where its library loads (the `nvml` backend)."""
REMOTE = "gpuwatch.backends.ssh:remote_snapshots"
"""Another machine's snapshots over ssh (`status --host`, `tui --host`)."""
DEFAULT_SIM_GPUS = 4


def remote_snapshots(
    host: str,
    *,
    interval_s: float,
    count: int | None,
    backend: str | None = None,
    sim: str | None = None,
) -> Iterator[tuple[Snapshot, list[Lease]]]:
    """`host`'s snapshots over ssh as they arrive (`gpuwatch.backends.ssh`); raises
    `RemoteError` naming the host on failure."""
    stream: Iterator[tuple[Snapshot, list[Lease]]] = defined(REMOTE)(
        host, interval_s=interval_s, count=count, backend=backend, sim=sim
    )
    return stream


def defined(target: str) -> Any:
    """What `target` (`module:name`: an entry of `BACKENDS`, `DRIVER` or `REMOTE`) names, its module
    imported now."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def open_backend(
    kind: str | None = None,
    sim: str | None = None,
    *,
    on_fallback: Callable[[str], None] | None = None,
    on_lost: Callable[[str], None] | None = None,
) -> Backend:
    """Opens the backend asked for, by argument or else by environment.

    `kind` is `auto`, `daemon`, `nvml` or `sim`; when `None`, `GPUWATCH_BACKEND`
    decides (default `auto`: the daemon if one answers, else the driver, and
    `on_fallback` is told why the daemon was passed over). `sim` is a GPU count
    or a scenario file; when `None`, `GPUWATCH_SIM` gives it. Asking for a
    simulated node implies the `sim` backend; `sim` alone simulates 4 GPUs.

    Under `auto`, a sample the daemon cannot give later (it restarts, or hangs)
    is read from the driver, and `on_lost` is told so once; where there is no
    driver either, `sample()` raises `DaemonUnavailableError` until the daemon
    is back, as it does under `daemon`. A daemon that serves a simulated node is never
    stood in for by the driver: its jobs hold leases on made-up GPUs, apart from real ones.
    """
    kind = kind or os.environ.get("GPUWATCH_BACKEND") or "auto"
    if kind not in BACKEND_KINDS:
        choices = ", ".join(BACKEND_KINDS)
        raise InvalidValueError(f"unknown backend {kind!r}: choose one of {choices}")
    if sim is not None and not sim.strip():  # not "no --sim": it would read the real driver
        raise InvalidValueError(f"--sim {sim!r}: give a GPU count (such as 4) or a scenario file")
    if sim and kind in ("nvml", "daemon"):
        raise InvalidValueError(f"--sim simulates GPUs, so it cannot go with --backend {kind}")
    given = f"--sim {sim}"
    if kind in ("auto", "sim") and sim is None:
        sim = os.environ.get("GPUWATCH_SIM") or None  # set but empty: as unset, like most tools
        given = f"GPUWATCH_SIM={sim}"
    if sim or kind == "sim":
        simulated: Backend = defined(BACKENDS["sim"]).from_spec(
            sim or str(DEFAULT_SIM_GPUS), given=given
        )
        return simulated
    if kind in ("auto", "daemon"):
        try:
            daemon = _open_daemon(required=kind == "daemon")
        except DaemonUnavailableError as error:
            if kind == "daemon":
                raise
            if on_fallback is not None:
                on_fallback(f"{error}; reading the driver directly")
        else:
            if kind == "daemon":
                return daemon
            auto: Backend = defined(BACKENDS["auto"])(daemon, _open_driver, on_lost=on_lost)
            return auto
    return _open_driver()


def _open_driver() -> Backend:
    """This machine's GPUs through the driver (`DRIVER`), opened when first asked for."""
    opened: Backend = defined(DRIVER)()
    return opened


def _open_daemon(*, required: bool) -> Backend:
    candidates = socket_candidates()
    if not required and not any(os.path.exists(path) for path in candidates):
        raise DaemonUnavailableError(f"no daemon socket at {' or '.join(candidates)}")
    daemon: Backend = defined(BACKENDS["daemon"])()
    return daemon
