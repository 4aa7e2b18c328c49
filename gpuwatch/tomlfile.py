"""Reading a TOML file that someone else may have written: bounded, and every failure one message.

`tomllib` alone reads a file of any size, raises `RecursionError` on deeply
nested arrays, and leaves decoding errors and special files (a FIFO blocks an
`open()` forever) to the caller.
"""

from __future__ import annotations

import os
import stat
import tomllib
from typing import Any

from gpuwatch.errors import InvalidValueError

MAX_TOML_BYTES = 1 << 20


def read_toml(path: str | os.PathLike[str], *, max_bytes: int = MAX_TOML_BYTES) -> dict[str, Any]:
    """The tables of the file at `path`.

    Raises `FileNotFoundError` when there is no such file, and `InvalidValueError`
    (saying what is wrong, without the path) for anything else that keeps it from
    being read as TOML.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise InvalidValueError(f"cannot read it: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidValueError("not a regular file")
        data = os.read(fd, max_bytes + 1)
    except OSError as error:
        raise InvalidValueError(f"cannot read it: {error.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InvalidValueError(f"larger than {max_bytes >> 10}KiB; is it the right file?")
    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError:
        raise InvalidValueError("not UTF-8 text; is it the right file?") from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidValueError(f"not valid TOML: {error}") from None
    except RecursionError:
        raise InvalidValueError("not valid TOML: nested too deeply") from None
