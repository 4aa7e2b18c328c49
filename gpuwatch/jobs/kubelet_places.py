"""Where this node's kubelet serves its pod-resources API: one answer for every reader (the
daemon's `--jobs auto`, and status, pick or the TUI without a daemon). Standard library only,
and little of it: a one-shot command that finds no kubelet pays for nothing more, as
`gpuwatch.jobs.slurm_places` is for Slurm."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves its pod-resources API (its `--root-dir` of /var/lib/kubelet)."""
ENV_SOCKET = "GPUWATCH_KUBELET_SOCKET"


def pod_resources_socket(environ: Mapping[str, str]) -> str:
    """The kubelet's socket: `$GPUWATCH_KUBELET_SOCKET`, else `DEFAULT_SOCKET`."""
    return environ.get(ENV_SOCKET) or DEFAULT_SOCKET


def is_socket(path: str) -> bool:
    """Whether `path` is a socket this process can see (the kubelet's directory is root's:
    to another user it is not there)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
