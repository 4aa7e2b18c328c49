"""Deferring a standard-library module that a dependency imports but a command never uses.

`dataclasses` imports `inspect` (and with it `ast`, `dis` and `tokenize`) only to
write a signature into the docstring of a class that has none; every gpuwatch
class has one. `gpuwatch pick` starts every job, so before it loads the data
model, `gpuwatch.cli.main` puts a placeholder in `inspect`'s place, which
becomes the real module the first time any attribute of it is used. Only
command-line entry points do this, as it changes the whole process.

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


def defer(name: str) -> None:
    """Makes `import name` (a top-level module) free until the module is first used.

    Does nothing when the module is already loaded.
    """
    if name not in sys.modules:
        sys.modules[name] = _Placeholder(name)
