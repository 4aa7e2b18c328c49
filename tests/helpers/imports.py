"""What a fresh interpreter has loaded after a statement: how tests see what an import costs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "textual", "click", "pynvml")
"""What `import gpuwatch`, and a script using its public API, never loads."""
HEAVY_FOR_COMMANDS = ("torch", "textual", "pynvml", "prometheus_client", "yaml", "bcrypt", "grpc")
"""What a one-shot command (`pick`, `status`, `where`) loads only where it uses it."""


def loaded_after(statement: str) -> set[str]:
    """Top-level modules a fresh interpreter holds after running `statement`."""
    code = f"{statement}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


def gpuwatch_modules(loaded: set[str]) -> set[str]:
    """The gpuwatch modules among `loaded` (dotted names)."""
    return {name for name in loaded if name == "gpuwatch" or name.startswith("gpuwatch.")}


# Module budgets: what each hot command may load. A new import on one of these paths fails a
# test here, before a benchmark shows it (bench/startup_vs_peers.py has the figures).
EVERY_COMMAND_MAY_LOAD = frozenset(
    "gpuwatch." + name if name else "gpuwatch"
    for name in (
        "", "_version", "errors", "models", "gpu_history", "text", "units", "paths",
        "backends", "backends.base",
        "cli", "cli._compat", "cli.exit_codes", "cli.group", "cli.options", "cli.terminal",
    )
)  # fmt: skip
"""What `gpuwatch --help` loads: the group and the options every command shares, no command."""
_THROUGH_THE_DAEMON = EVERY_COMMAND_MAY_LOAD | {
    "gpuwatch." + name
    for name in (
        "backends.auto", "backends.daemon_client", "choices", "request", "holders",
        "record_fields", "procfs",
        "jobs", "jobs.job_table", "jobs.engines", "jobs.kubelet_places", "jobs.slurm_places",
        "leases", "leases.directory", "leases.locking", "leases.records",
        "sampling", "sampling.node_jobs", "sampling.jobs_cache", "sampling.allocated_idle",
    )
}  # fmt: skip
_STATUS = {"gpuwatch.cli.status", "gpuwatch.cli.status_jobs", "gpuwatch.cli.table",
           "gpuwatch.sampling.ticks"}  # fmt: skip
_PICK = {"gpuwatch.cli.pick", "gpuwatch.cli.wish_options"} | {
    "gpuwatch.placement" + name
    for name in ("", ".acquire", ".gpus", ".holding", ".launch", ".mig", ".rules", ".visible",
                 ".wanted")
}  # fmt: skip
_DRIVER = {"gpuwatch.backends.driver", "gpuwatch.backends.nvml", "gpuwatch.backends.mig_changes",
           "gpuwatch.hostinfo"}  # fmt: skip
STATUS_THROUGH_THE_DAEMON_MAY_LOAD = _THROUGH_THE_DAEMON | _STATUS
PICK_THROUGH_THE_DAEMON_MAY_LOAD = _THROUGH_THE_DAEMON | _PICK
STATUS_ON_THE_DRIVER_MAY_LOAD = STATUS_THROUGH_THE_DAEMON_MAY_LOAD | _DRIVER
PICK_ON_THE_DRIVER_MAY_LOAD = PICK_THROUGH_THE_DAEMON_MAY_LOAD | _DRIVER
NOT_THROUGH_THE_DAEMON = (
    "psutil", "logging", "subprocess", "asyncio", "hashlib", "tempfile", "ctypes", "random",
    "http", "email", "ssl", "pynvml",
)  # fmt: skip
"""Standard and third-party modules a command the daemon answers has no use for: each costs
5 to 50 M instructions to import (the driver's path needs psutil, ctypes and pynvml)."""
