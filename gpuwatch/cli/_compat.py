"""Shims over differences between versions of third-party libraries, each explained.

click 8.4 made `ParamType` generic in its value type; older versions are not
subscriptable at run time. Type checkers see the generic form, the interpreter
the plain class, so one definition works with click 8.1 and later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    AnyParamType = click.ParamType[Any]
else:
    AnyParamType = click.ParamType
