"""Where the daemon's socket is: one answer for the daemon and its clients.

The daemon listens on `--socket`, else `$RUNTIME_DIRECTORY/gpuwatch.sock` when
systemd gave it a runtime directory (`/run/gpuwatch`), else
`$XDG_RUNTIME_DIR/gpuwatch.sock` (the user's own). Clients look at
`$GPUWATCH_SOCKET`, else at the system's socket, then at the user's.
"""

from __future__ import annotations

import os

ENV_SOCKET = "GPUWATCH_SOCKET"
SOCKET_NAME = "gpuwatch.sock"
SYSTEM_SOCKET = "/run/gpuwatch/gpuwatch.sock"


def socket_candidates() -> list[str]:
    """Where clients look for a daemon, in order."""
    if configured := os.environ.get(ENV_SOCKET):
        return [configured]
    candidates = [SYSTEM_SOCKET]
    if runtime_dir := os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(os.path.join(runtime_dir, SOCKET_NAME))
    return candidates


def daemon_socket_path() -> str | None:
    """Where a daemon started without `--socket` listens; `None` when nowhere fits."""
    for variable in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        if directory := os.environ.get(variable):
            # systemd may list several runtime directories, separated by colons.
            return os.path.join(directory.split(":")[0], SOCKET_NAME)
    return None
