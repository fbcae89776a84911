"""``struct``: ``dataclasses.dataclass`` with fewer methods compiled at import (project-internal).

On Python 3.11 a dataclass compiles each method it writes with its own ``exec`` (~60-90 us apiece
here): ``__init__``, ``__repr__``, ``__eq__``, and for a frozen class ``__setattr__``, ``__delattr__``
and ``__hash__``. The ~100 dataclasses ``agentsessions serve`` loads took ~520 of them, about a
quarter of its imports (bench/README.md, "Start-up"). ``struct`` lets ``dataclass`` write only what
must be compiled per class (``__init__``, and a frozen class's ``__setattr__``/``__delattr__``) and
gives the class ``__repr__``, ``__eq__`` and ``__hash__`` made from shared code, with the same
behaviour: the fields' own ``repr``/``compare``/``hash`` flags, ``NotImplemented`` for another
class, a class's own methods kept, ``__hash__`` set as ``dataclass`` sets it (over the compared
fields when frozen, ``None`` when only ``eq``). ``order`` and ``unsafe_hash`` are not offered (no
class here uses them).
The class is a dataclass in every other respect (``fields``, ``replace``, ``asdict``, slots), except
that its ``__dataclass_params__`` say ``repr=False, eq=False``: those methods are not dataclass's.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

_C = TypeVar("_C", bound=type)


@overload
def struct(cls: _C, /) -> _C: ...


@overload
def struct(
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    kw_only: bool = False,
    slots: bool = False,
) -> Callable[[_C], _C]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def struct(
    cls: _C | None = None,
    /,
    *,
    init: bool = True,
    repr: bool = True,
    eq: bool = True,
    frozen: bool = False,
    kw_only: bool = False,
    slots: bool = False,
) -> _C | Callable[[_C], _C]:
    """As ``dataclasses.dataclass`` with these parameters (see the module docstring)."""

    def wrap(c: _C) -> _C:
        made: Any = dataclasses.dataclass(
            c, init=init, repr=False, eq=False, frozen=frozen, kw_only=kw_only, slots=slots
        )
        own = c.__dict__
        if repr and "__repr__" not in own:
            made.__repr__ = _repr_of(made)
        if eq:
            if "__eq__" not in own:
                made.__eq__ = _eq_of(made)
            explicit = own.get("__hash__", dataclasses.MISSING)
            if explicit is dataclasses.MISSING or (explicit is None and "__eq__" in own):
                # dataclass's rule for eq without unsafe_hash: hashable when frozen, else not.
                made.__hash__ = _hash_of(made) if frozen else None
        return made  # type: ignore[no-any-return]

    return wrap if cls is None else wrap(cls)


def _names(cls: type, flag: Callable[[dataclasses.Field[Any]], bool]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if flag(f))


def _values(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The named attributes of an instance as a tuple (``attrgetter`` of one name is not one)."""
    if not names:
        return lambda _: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda obj: (one(obj),)
    return operator.attrgetter(*names)


def _repr_of(cls: type) -> Callable[[Any], str]:
    names = _names(cls, lambda f: f.repr)

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _eq_of(cls: type) -> Callable[[Any, object], Any]:
    values = _values(_names(cls, lambda f: f.compare))

    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash_of(cls: type) -> Callable[[Any], int]:
    values = _values(_names(cls, lambda f: f.compare if f.hash is None else f.hash))

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__
