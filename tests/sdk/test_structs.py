"""``agentsessions.sdk.structs.struct`` behaves as ``dataclasses.dataclass``: each case builds the
same class body both ways and compares what their instances do (repr, equality, hashing,
immutability, the dataclass functions), and checks that ``struct`` compiled fewer methods."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentsessions.sdk.structs import struct

Decorator = Callable[..., Any]


def twins(body: Callable[[Decorator], type]) -> tuple[type, type]:
    """The class ``body`` makes with ``dataclass`` and with ``struct``."""
    return body(dataclasses.dataclass), body(struct)


def plain(deco: Decorator) -> type:
    @deco
    class Plain:
        x: int
        y: str = "y"
        items: list[int] = field(default_factory=list)

    return Plain


def frozen(deco: Decorator) -> type:
    @deco(frozen=True)
    class Frozen:
        x: int
        secret: str = field(default="s", repr=False)
        noise: int = field(default=0, compare=False)
        label: str = field(default="l", hash=False)
        shared: ClassVar[int] = 7

    return Frozen


def slotted(deco: Decorator) -> type:
    @deco(frozen=True, slots=True)
    class Slotted:
        a: int
        b: tuple[int, ...] = ()

    return Slotted


def one_field(deco: Decorator) -> type:
    @deco(frozen=True)
    class One:
        only: str

    return One


def no_fields(deco: Decorator) -> type:
    @deco(frozen=True)
    class Empty:
        pass

    return Empty


def no_eq(deco: Decorator) -> type:
    @deco(eq=False, slots=True)
    class Identity:
        x: int

    return Identity


def own_methods(deco: Decorator) -> type:
    @deco(frozen=True)
    class Own:
        x: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Own)

        def __hash__(self) -> int:
            return 42

    return Own


def eq_only(deco: Decorator) -> type:
    @deco
    class EqOnly:
        x: int

        def __eq__(self, other: object) -> bool:
            return True

    return EqOnly


CASES: dict[str, tuple[Callable[[Decorator], type], tuple[Any, ...], tuple[Any, ...]]] = {
    # name: (body, args of an instance, args of a different instance)
    "plain": (plain, (1, "a", [1]), (2, "a", [1])),
    "frozen": (frozen, (1, "s", 3, "l"), (2, "s", 3, "l")),
    "slotted": (slotted, (1, (2, 3)), (1, (3,))),
    "one field": (one_field, ("a",), ("b",)),
    "no fields": (no_fields, (), ()),
    "no eq": (no_eq, (1,), (1,)),
    "own methods": (own_methods, (1,), (2,)),
    "eq only": (eq_only, (1,), (2,)),
}


def observe(cls: type, args: tuple[Any, ...], other: tuple[Any, ...]) -> dict[str, Any]:
    """What an instance of ``cls`` does, in a form comparable across the two twins."""
    a, same, b = cls(*args), cls(*args), cls(*other)
    seen: dict[str, Any] = {
        "repr": repr(a).replace(cls.__qualname__, "C"),
        "eq": (a == same, a == b, a != b, a == object(), a.__eq__(object())),
        "hashable": cls.__hash__ is not None,
        "fields": [(f.name, f.repr, f.compare, f.hash) for f in dataclasses.fields(cls)],
        "astuple": dataclasses.astuple(a),
        "match_args": getattr(cls, "__match_args__", None),
        "slots": getattr(cls, "__slots__", None),
        "copy": copy.copy(a) == a,
    }
    if seen["hashable"]:
        seen["hash"] = (hash(a) == hash(same), hash(a) == hash(b) if a == b else None)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    seen["params"] = (params.init, params.frozen)
    if dataclasses.fields(cls):
        first = dataclasses.fields(cls)[0].name
        seen["replace"] = repr(dataclasses.replace(a, **{first: getattr(b, first)})) == repr(b)
        if params.frozen:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(a, first, getattr(b, first))
            with pytest.raises(dataclasses.FrozenInstanceError):
                delattr(a, first)
    return seen


@pytest.mark.parametrize("name", CASES)
def test_a_struct_does_what_its_dataclass_twin_does(name: str) -> None:
    body, args, other = CASES[name]
    as_dataclass, as_struct = twins(body)
    assert observe(as_struct, args, other) == observe(as_dataclass, args, other)


def test_a_struct_compiles_fewer_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    create = dataclasses._create_fn  # type: ignore[attr-defined]

    def counting(name: str, *args: Any, **kwargs: Any) -> Any:
        made.append(name)
        return create(name, *args, **kwargs)

    monkeypatch.setattr(dataclasses, "_create_fn", counting)
    frozen(dataclasses.dataclass)
    assert sorted(made) == ["__delattr__", "__eq__", "__hash__", "__init__", "__repr__", "__setattr__"]
    made.clear()
    frozen(struct)
    assert sorted(made) == ["__delattr__", "__init__", "__setattr__"]


def test_another_class_and_a_subclass_are_not_equal_as_with_dataclass() -> None:
    @struct(frozen=True)
    class Base:
        x: int

    class Sub(Base):
        pass

    @struct(frozen=True)
    class Other:
        x: int

    assert Base(1) != Sub(1) and Sub(1) != Base(1)
    another: object = Other(1)
    assert Base(1) != another
    assert Sub(1) == Sub(1) and hash(Sub(1)) == hash(Base(1))


def test_a_recursive_repr_ends() -> None:
    @struct
    class Node:
        children: list[Any]

    node = Node([])
    node.children.append(node)
    assert repr(node) == "test_a_recursive_repr_ends.<locals>.Node(children=[...])"


def test_a_struct_pickles() -> None:
    restored = pickle.loads(pickle.dumps(Point(1, 2)))
    assert restored == Point(1, 2) and repr(restored) == "Point(x=1, y=2)"


@struct(frozen=True, slots=True)
class Point:
    x: int
    y: int


SHIPPED = ("host/src", "sdk/src", "harnesses/src")
DATACLASS = re.compile(r"^[ \t]*@(dataclasses\.)?dataclass\b", re.M)


def test_the_shipped_packages_make_their_dataclasses_with_struct() -> None:
    root = Path(__file__).resolve().parents[2]
    found = [
        f"{path.relative_to(root)}:{text[: m.start()].count(chr(10)) + 1}"
        for package in SHIPPED
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "structs.py"
        for text in [path.read_text(encoding="utf-8")]
        for m in DATACLASS.finditer(text)
    ]
    assert found == [], "use agentsessions.sdk.structs.struct (a shorter start; see its docstring)"
    assert len(list((root / "host/src").rglob("*.py"))) > 100  # the walk saw the packages


# -- replace ----------------------------------------------------------------------------------


def _replace_cases() -> list[tuple[str, Any, dict[str, Any]]]:
    @struct(frozen=True, slots=True)
    class FrozenSlots:
        a: int
        b: str = "b"
        c: tuple[int, ...] = ()

    @struct(frozen=True)
    class FrozenDict:
        a: int
        labels: dict[str, str] = field(default_factory=dict)
        b: str | None = None

    @struct
    class Mutable:
        a: int
        b: list[int] = field(default_factory=list)

    @struct(slots=True, kw_only=True)
    class KeywordSlots:
        a: int
        b: int = 2

    return [
        ("frozen slots", FrozenSlots(1, "x", (1, 2)), {"b": "y"}),
        ("frozen slots, every field", FrozenSlots(1), {"a": 2, "b": "z", "c": (3,)}),
        ("frozen slots, nothing", FrozenSlots(1), {}),
        ("frozen dict", FrozenDict(1, {"k": "v"}), {"b": "set"}),
        ("mutable dict", Mutable(1, [1]), {"a": 5}),
        ("keyword-only slots", KeywordSlots(a=1), {"b": 3}),
    ]


@pytest.mark.parametrize("case", _replace_cases(), ids=lambda c: c[0])
def test_replace_gives_what_dataclasses_replace_gives(case: tuple[str, Any, dict[str, Any]]) -> None:
    from agentsessions.sdk.structs import replace

    _, obj, changes = case
    made = replace(obj, **changes)
    expected = dataclasses.replace(obj, **changes)
    assert made == expected and type(made) is type(expected)
    assert made is not obj
    for f in dataclasses.fields(obj):
        assert getattr(made, f.name) is getattr(expected, f.name)  # the same values, not copies
    if dataclasses.fields(obj) and type(obj).__dataclass_params__.frozen:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, dataclasses.fields(obj)[0].name, 0)


def test_replace_refuses_a_name_that_is_no_field_as_dataclasses_does() -> None:
    from agentsessions.sdk.structs import replace

    for _, obj, _ in _replace_cases():
        with pytest.raises(TypeError, match="nope"):
            replace(obj, nope=1)


def test_replace_runs_post_init_and_init_only_values_through_init() -> None:
    from agentsessions.sdk.structs import replace

    @struct(frozen=True)
    class Checked:
        n: int

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError(f"n must be >= 0, got {self.n}")

    with pytest.raises(ValueError, match="got -1"):
        replace(Checked(1), n=-1)

    @struct
    class Scaled:
        n: int
        factor: dataclasses.InitVar[int] = 1

        def __post_init__(self, factor: int) -> None:
            self.n *= factor

    assert replace(Scaled(2), n=3, factor=10).n == 30

    @struct
    class Derived:
        n: int
        twice: int = field(init=False, default=0)

    assert replace(Derived(2), n=4) == dataclasses.replace(Derived(2), n=4)


def test_replace_does_not_copy_what_is_not_a_field() -> None:
    import functools

    from agentsessions.sdk.structs import replace

    @struct(frozen=True)
    class Cached:
        n: int

        @functools.cached_property
        def square(self) -> int:
            return self.n * self.n

    first = Cached(3)
    assert first.square == 9
    assert replace(first, n=4).square == 16

    @struct
    class OwnInit:
        n: int

        def __init__(self, n: int) -> None:
            self.n = n + 100

    assert replace(OwnInit(1), n=2).n == dataclasses.replace(OwnInit(1), n=2).n == 102
