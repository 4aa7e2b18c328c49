"""A real terminal for the screens: a detached tmux session running one command, read as text."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers.wait import wait_until

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))


class Tmux:
    """A detached tmux session running one command, read as plain text."""

    def __init__(self, command: str, size: tuple[int, int]) -> None:
        self.name = f"gpuwatch-test-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name]  # a server of its own: no other session interferes
        env = {**os.environ, "TERM": "xterm-256color"}
        subprocess.run(
            [
                *self.tmux,
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                str(size[0]),
                "-y",
                str(size[1]),
                f"{command}; echo EXIT=$?; sleep 600",
            ],
            check=True,
            env=env,
        )

    def text(self) -> str:
        out = subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", self.name],
            check=False,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def wait_for(self, needle: str, timeout_s: float = 60) -> str:
        """The screen, once it shows `needle` (the last screen seen is named if it never does)."""

        def showing() -> str | None:
            return screen if needle in (screen := self.text()) else None

        return wait_until(showing, f"{needle!r} to appear", timeout_s=timeout_s, interval_s=0.2)

    def press(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)
