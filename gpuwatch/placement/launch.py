"""Starting the user's command on the chosen GPUs."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from gpuwatch.errors import CommandNotExecutableError, CommandNotFoundError


def exec_command(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replaces this process with `argv`.

    The command keeps this pid, so it receives the signals sent to it and its
    exit status is the one the caller sees, with nothing in between. Leases
    marked to pass to the child stay held for as long as it runs.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], list(argv), dict(env))
    except FileNotFoundError:
        raise CommandNotFoundError(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise CommandNotExecutableError(f"{argv[0]}: permission denied") from None
    except OSError as error:
        raise CommandNotExecutableError(f"{argv[0]}: cannot execute: {error.strerror}") from None
