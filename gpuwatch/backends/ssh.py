"""Another machine's GPUs over SSH: `gpuwatch status --host user@node`.

gpuwatch runs `gpuwatch status --json --watch ...` on the host through `ssh`
and reads the NDJSON it streams back. SSH does the authentication and the
encryption; no port is opened anywhere. The host needs gpuwatch on the PATH
of a non-interactive shell.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Iterator

from gpuwatch.errors import RemoteError
from gpuwatch.models import Lease, Snapshot

_SSH_FAILED = 255  # ssh's own exit status for a connection or authentication failure
_NOT_FOUND = 127  # the remote shell's, for a command it cannot find


def remote_command(
    host: str,
    *,
    interval_s: float,
    count: int | None,
    backend: str | None = None,
    sim: str | None = None,
    ssh: str = "ssh",
) -> list[str]:
    """The ssh command line that streams `host`'s snapshots."""
    remote = ["gpuwatch", "status", "--json", "--watch", f"{interval_s:g}"]
    if count is not None:
        remote += ["--count", str(count)]
    if backend is not None:
        remote += ["--backend", backend]
    if sim is not None:
        remote += ["--sim", sim]
    options = [
        "BatchMode=yes",  # fail at once rather than ask for a password nobody can type
        "ConnectTimeout=10",  # a host that never answers is an error, not a hang
        "ServerAliveInterval=5",  # ... nor is one that stops answering mid-stream
        "ServerAliveCountMax=3",
    ]
    return [
        ssh,
        *(arg for option in options for arg in ("-o", option)),
        "--",
        host,
        shlex.join(remote),
    ]


def remote_snapshots(
    host: str,
    *,
    interval_s: float,
    count: int | None,
    backend: str | None = None,
    sim: str | None = None,
) -> Iterator[tuple[Snapshot, list[Lease]]]:
    """Snapshots of `host` as they arrive; raises `RemoteError` naming the host on failure."""
    argv = remote_command(host, interval_s=interval_s, count=count, backend=backend, sim=sim)
    with tempfile.TemporaryFile("w+") as errors:
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=errors, text=True, stdin=subprocess.DEVNULL
            )
        except FileNotFoundError:
            raise RemoteError("ssh is not installed here: install the OpenSSH client") from None
        with process:
            try:
                assert process.stdout is not None
                for line in process.stdout:
                    yield _parse(host, line)
            finally:
                if process.poll() is None:
                    process.terminate()  # the reader stopped early (Ctrl-C, a closed pipe)
            if process.wait() != 0:
                errors.seek(0)
                raise RemoteError(_failure(host, process.returncode, errors.read()))


def _parse(host: str, line: str) -> tuple[Snapshot, list[Lease]]:
    try:
        data = json.loads(line)
        leases = [Lease(**lease) for lease in data.get("leases", [])]
        return Snapshot.from_dict(data), leases
    except (ValueError, KeyError, TypeError, AttributeError):
        raise RemoteError(f"{host}: unexpected output from gpuwatch there: {line[:80]!r}") from None


def _failure(host: str, returncode: int, stderr: str) -> str:
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    if returncode == _SSH_FAILED:
        return f"cannot reach {host}: {last or 'ssh failed'}"
    if returncode == _NOT_FOUND:
        return f"gpuwatch is not installed on {host} (or not on the PATH ssh gives it)"
    return f"{host}: {last.removeprefix('gpuwatch: error: ') or f'exit status {returncode}'}"
