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
