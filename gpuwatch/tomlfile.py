"""Reading a TOML file that someone else may have written: bounded, and every failure one message.

`tomllib` alone reads a file of any size, raises `RecursionError` on deeply
nested arrays, and leaves decoding errors and special files (a FIFO blocks an
`open()` forever) to the caller. The file is read by `gpuwatch.paths.read_regular_file`.
"""

from __future__ import annotations

import errno
import os
import tomllib
from typing import Any

from gpuwatch.errors import InvalidValueError, UnreadableFileError
from gpuwatch.paths import read_regular_file

MAX_TOML_BYTES = 1 << 20


def read_toml(path: str | os.PathLike[str], *, max_bytes: int = MAX_TOML_BYTES) -> dict[str, Any]:
    """The tables of the file at `path`.

    Raises `FileNotFoundError` when there is no such file, and `InvalidValueError`
    (saying what is wrong, without the path) for anything else that keeps it from
    being read as TOML.
    """
    try:
        data = read_regular_file(path, max_bytes)
    except UnreadableFileError as error:
        if error.errno == errno.ENOENT:
            raise FileNotFoundError(error.errno, str(error), os.fspath(path)) from None
        raise InvalidValueError(_why(error)) from None
    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError:
        raise InvalidValueError("not UTF-8 text; is it the right file?") from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidValueError(f"not valid TOML: {error}") from None
    except RecursionError:
        raise InvalidValueError("not valid TOML: nested too deeply") from None


def _why(error: UnreadableFileError) -> str:
    if error.max_bytes is not None:
        return f"larger than {error.max_bytes >> 10}KiB; is it the right file?"
    if error.kind is not None:
        return "not a regular file"
    return f"cannot read it: {error}"
