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

``replace`` is ``dataclasses.replace`` for the instances of classes that need no ``__init__`` to be
copied (no ``__post_init__``, every field an ``__init__`` argument): it copies their fields as they
are, 1.5-3x faster (``dataclasses.replace`` walks the fields and calls ``__init__`` with keywords,
which a frozen class answers with an ``object.__setattr__`` per field). Other classes go through
``dataclasses.replace``. The host replaces a few rows and projections on every turn.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

_C = TypeVar("_C", bound=type)
_T = TypeVar("_T")


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


def replace(obj: _T, /, **changes: Any) -> _T:
    """``dataclasses.replace(obj, **changes)``, faster where ``obj``'s class allows (module docstring)."""
    cls = obj.__class__
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _copier(cls)
    return copier(obj, changes)  # type: ignore[no-any-return]


_Copier = Callable[[Any, dict[str, Any]], Any]
_COPIERS: dict[type, _Copier] = {}


def _by_init(obj: Any, changes: dict[str, Any]) -> Any:
    return dataclasses.replace(obj, **changes)


def _copier(cls: type) -> _Copier:
    """How ``replace`` copies instances of ``cls``: their fields as they are, when nothing but the
    fields makes an instance; else through ``__init__`` (``dataclasses.replace``, which also says
    what is wrong with a call it cannot make)."""
    if not dataclasses.is_dataclass(cls) or cls.__new__ is not object.__new__:
        return _by_init
    fields = dataclasses.fields(cls)
    declared: dict[str, Any] = getattr(cls, "__dataclass_fields__", {})
    if (
        hasattr(cls, "__post_init__")
        or len(declared) != len(fields)  # InitVar (or ClassVar) pseudo-fields
        or not all(f.init for f in fields)
    ):
        return _by_init
    names = tuple(f.name for f in fields)
    known = frozenset(names)
    if cls.__dictoffset__ == 0:  # slots: no __dict__
        if any(f.kw_only for f in fields):
            return _by_init
        values = _values(names)
        index = {name: i for i, name in enumerate(names)}

        def copy_slots(obj: Any, changes: dict[str, Any]) -> Any:
            current = list(values(obj))
            for name, value in changes.items():
                i = index.get(name)
                if i is None:
                    return _by_init(obj, changes)
                current[i] = value
            return cls(*current)  # __init__ positionally: a slot class's own copy is no faster

        return copy_slots

    init = getattr(cls.__init__, "__code__", None)
    if init is None or init.co_filename != "<string>":
        return _by_init  # an __init__ of the class's own, not dataclass's: it may do more

    def copy_dict(obj: Any, changes: dict[str, Any]) -> Any:
        state = obj.__dict__
        if not known.issuperset(changes) or state.keys() != known:
            # A name that is no field, or an instance holding more than its fields (a cached
            # property's value would not hold for the copy): as dataclasses does it.
            return _by_init(obj, changes)
        made = object.__new__(cls)
        copied = made.__dict__
        copied.update(state)
        copied.update(changes)
        return made

    return copy_dict
