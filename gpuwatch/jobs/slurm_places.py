"""Where this node's Slurm keeps its configuration: one answer for every reader (the
daemon's `--jobs auto`, and status, pick or the TUI without a daemon). Standard library
only, and little of it: a one-shot status pays for every module it loads."""

from __future__ import annotations

import os
from collections.abc import Mapping

SLURM_CONF_PLACES = (
    "/etc/slurm/slurm.conf",
    "/run/slurm/conf/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
)
"""Where Slurm's commands find their configuration without `SLURM_CONF`: the default, the
copy slurmd keeps of a configless cluster's, and older Debian's."""


def configured_slurm_conf(environ: Mapping[str, str]) -> str | None:
    """The slurm.conf Slurm's commands would read: `$SLURM_CONF` (even missing: whoever set
    it means this Slurm), else the first of `SLURM_CONF_PLACES` that exists; `None` where
    there is none (a client package installed for nothing: its commands would only fail)."""
    if conf := environ.get("SLURM_CONF"):
        return conf
    return next((place for place in SLURM_CONF_PLACES if os.path.isfile(place)), None)
