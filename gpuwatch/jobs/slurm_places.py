"""Where this node's Slurm keeps its configuration: one answer for every reader (the
daemon's `--jobs auto`, and status, pick or the TUI without a daemon). Standard library
only, and little of it: a one-shot status pays for every module it loads."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence

SLURM_CONF_PLACES = (
    "/etc/slurm/slurm.conf",
    "/run/slurm/conf/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
)
"""Where Slurm's commands find their configuration without `SLURM_CONF`: the default, the
copy slurmd keeps of a configless cluster's, and older Debian's."""


def configured_slurm_conf(
    environ: Mapping[str, str], places: Sequence[str] | None = None
) -> str | None:
    """The slurm.conf Slurm's commands would read: `$SLURM_CONF` (even missing: whoever set
    it means this Slurm), else the first of `places` (`SLURM_CONF_PLACES`) that is there,
    or that this user may not look at (reading it then says "permission denied", never "not
    found"); `None` where there is none (a client package installed for nothing: its
    commands would only fail)."""
    if conf := environ.get("SLURM_CONF"):
        return conf
    searched = SLURM_CONF_PLACES if places is None else places
    return next((place for place in searched if _there(place)), None)


def _there(path: str) -> bool:
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:  # permission denied: there, for all this user can tell
        return True
