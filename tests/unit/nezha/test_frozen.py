"""quick_init: a frozen dataclass made by its quick __init__ is the one its generated __init__ makes."""

import dataclasses
import inspect
import math

import pytest

from cachenode.fill.judged import Judged
from cachenode.fill.lead import Decision, Step
from cachenode.http.freshness import Policy
from nezha.frozen import quick_init


def plain_twin(cls: type) -> type:
    """`cls` as `dataclass(frozen=True)` alone makes it: with the generated __init__."""
    fields = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True)


POLICY = Policy(True, "ok", 60.0, stale_if_error=0.0)
CALLS = [
    (Policy, (True, "ok"), {}),
    (Policy, (False, "status 206"), {"ttl": -3.0}),
    (Policy, (True, "ok", 3599.0, math.inf, 30.0, True), {}),
    (Judged, (), {"now": 5.0, "authorize": False, "policy": POLICY, "expires_at": 65.0, "kept": (("ETag", '"e"'),),
                  "vary": ("accept",), "chunk_size": None, "length": 3, "age": 0.0,
                  "decision": Decision(Step.PASS, "why")}),
]


@pytest.mark.parametrize(("cls", "args", "kwargs"), CALLS)
def test_the_quick_init_makes_what_the_generated_one_makes(cls, args, kwargs):
    twin = plain_twin(cls)
    quick, plain = cls(*args, **kwargs), twin(*args, **kwargs)
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert repr(quick) == repr(plain) and hash(quick) == hash(plain)
    assert quick == cls(*args, **kwargs) and quick == dataclasses.replace(quick)
    assert inspect.signature(cls) == inspect.signature(twin)


@pytest.mark.parametrize("cls", [Policy, Judged])
def test_a_quick_inits_class_stays_frozen(cls):
    args, kwargs = next((args, kwargs) for c, args, kwargs in CALLS if c is cls)
    instance = cls(*args, **kwargs)
    for name in (f.name for f in dataclasses.fields(cls)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(instance, name, None)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(instance, name)


def test_a_missing_or_unknown_argument_is_refused_as_before():
    with pytest.raises(TypeError):
        Policy(True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Policy(True, "ok", colour="red")  # type: ignore[call-arg]


def test_classes_quick_init_cannot_make_whole_are_refused():
    @dataclasses.dataclass
    class Thawed:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class Posted:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    for cls in (Thawed, Factory, Posted, Slotted, int):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_fields_named_as_the_quick_inits_own_locals_are_set_as_given():
    """A field may be named as any local the quick __init__ uses (its
    instance's, its __dict__'s): the generated init takes `self` and `d`
    as fields like any other, and so must the quick one."""

    @dataclasses.dataclass(frozen=True)
    class Named:
        d: int
        self: str = "s"

    twin = plain_twin(Named)
    quick = quick_init(Named)(7, "me")
    assert dataclasses.astuple(quick) == dataclasses.astuple(twin(7, "me")) == (7, "me")
    assert repr(quick) == repr(twin(7, "me")).replace(twin.__qualname__, Named.__qualname__)


def test_a_class_whose_init_takes_more_than_its_fields_is_refused():
    """An InitVar is an argument of the generated __init__ but no field
    (`dataclasses.fields` leaves it out): a quick __init__ of the fields
    alone would refuse every call that passes it, so the class is refused."""

    @dataclasses.dataclass(frozen=True)
    class Passed:
        x: int
        extra: dataclasses.InitVar[int] = 0

    assert Passed(1, extra=2) == Passed(1)  # what its own __init__ takes
    with pytest.raises(TypeError):
        quick_init(Passed)


def test_a_class_with_its_own_init_is_refused():
    """`init=False`: the class's own __init__, which a quick one of its fields would silently replace."""

    @dataclasses.dataclass(frozen=True, init=False)
    class Own:
        x: int

        def __init__(self, x: int) -> None:  # the fields' signature, another instance
            object.__setattr__(self, "x", x * 2)

    with pytest.raises(TypeError):
        quick_init(Own)
    assert Own(3).x == 6
