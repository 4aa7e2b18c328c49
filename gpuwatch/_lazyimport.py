"""Deferring standard-library modules that dependencies import but a command never uses.

A command's start-up time is paid on every run (`gpuwatch pick` stands in front
of every job), and some of it goes to modules imported only in case:

- `dataclasses` imports `inspect` (and with it `ast`, `dis` and `tokenize`)
  only to write a signature into the docstring of a class that has none;
  every gpuwatch class has one.
- pynvml imports `ctypes.util` for `find_library`, which it calls only on
  Windows; `ctypes.util` imports `shutil`, `subprocess` and `tempfile`.

So `gpuwatch.cli.main` puts a placeholder in each one's place before anything
imports it; the placeholder becomes the real module the first time any of its
attributes is used, so nothing changes but the time. Only command-line entry
points do this, as it changes the whole process.

(importlib's `LazyLoader` would be the standard tool, but until Python 3.12 a
second `import` of a lazy module loads it at once.)
"""

from __future__ import annotations

import sys
import types

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any


class _Placeholder(types.ModuleType):
    """Stands in for a module until one of its attributes is used, then becomes it."""

    def __getattr__(self, attribute: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = __import__(self.__name__)
        # Whoever imported the placeholder holds it: give it everything the module has.
        self.__dict__.update(real.__dict__)
        return getattr(real, attribute)


UNUSED_AT_START = ("inspect", "shutil", "subprocess", "tempfile")


def defer(name: str) -> None:
    """Makes `import name` (a top-level module) free until the module is first used.

    Does nothing when the module is already loaded.
    """
    if name not in sys.modules:
        sys.modules[name] = _Placeholder(name)
