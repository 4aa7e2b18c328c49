"""The equality, hash and repr of frozen dataclasses, written once instead of per class.

`@dataclass` writes the source of each method it adds and compiles it as the class is
defined: on every start of every command, for every class. For the data model that was a
sixth of what `gpuwatch status` costs over a bare interpreter. A class that says
`@dataclass(frozen=True, slots=True, eq=False, repr=False)` and derives from `FrozenValue`
gets the same behaviour as dataclass's own methods, compiled once into this module's
bytecode: equal when of the same class with equal fields in order, hashed as the tuple of
its fields, shown as `Name(field=value, ...)`. Fields declared `compare=False` or
`repr=False` are left out as dataclass leaves them out.
"""

from __future__ import annotations

from dataclasses import fields

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

_compared: dict[type, tuple[str, ...]] = {}
_shown: dict[type, tuple[str, ...]] = {}


class FrozenValue:
    """A base for frozen dataclasses declared with `eq=False, repr=False` (see the module)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return _values(self) == _values(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_values(self))

    def __repr__(self) -> str:
        names = _shown.get(self.__class__) or _names(self.__class__)[1]
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"


def _values(value: Any) -> tuple[Any, ...]:
    names = _compared.get(value.__class__) or _names(value.__class__)[0]
    return tuple([getattr(value, name) for name in names])


def _names(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fields compared (and hashed) and the fields shown, as dataclass chooses them."""
    found = fields(cls)
    _compared[cls] = tuple(field.name for field in found if field.compare)
    _shown[cls] = tuple(field.name for field in found if field.repr)
    return _compared[cls], _shown[cls]
