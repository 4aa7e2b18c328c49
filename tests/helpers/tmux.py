"""A real terminal for the screens: a detached tmux session running one command, read as text."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from tests.helpers.wait import wait_until

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))


class Tmux:
    """A detached tmux session running one command, read as plain text."""

    def __init__(self, command: str, size: tuple[int, int], *, record: Path | None = None) -> None:
        """With `record`, every byte `command` writes to the terminal is kept in that file,
        from its first; OSC 52 (a clipboard write) is let through to a paste buffer."""
        self.name = f"gpuwatch-test-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name]  # a server of its own: no other session interferes
        env = {**os.environ, "TERM": "xterm-256color"}
        if record is not None:  # the command waits until the recording has begun
            command = f"{shlex.join([*self.tmux, 'wait-for', 'recording'])}; {command}"
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
        if record is not None:
            self._ask("set-option", "-g", "set-clipboard", "on")
            self._ask("pipe-pane", "-o", "-t", self.name, f"cat >> {shlex.quote(str(record))}")
            self._ask("wait-for", "-S", "recording")

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

    def title(self) -> str:
        """The pane's title, which a program sets with OSC 0 or 2."""
        return self._ask("display-message", "-p", "-t", self.name, "#{pane_title}")

    def buffers(self) -> str:
        """The paste buffers, one line each: a clipboard write (OSC 52) adds one."""
        return self._ask("list-buffers")

    def _ask(self, *command: str) -> str:
        out = subprocess.run([*self.tmux, *command], check=True, capture_output=True, text=True)
        return out.stdout

    def resize(self, size: tuple[int, int]) -> None:
        """The terminal becomes `size` (columns, lines), as when its window is resized."""
        self._ask("resize-window", "-t", self.name, "-x", str(size[0]), "-y", str(size[1]))

    def press(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False, capture_output=True)
