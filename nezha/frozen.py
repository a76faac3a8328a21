"""Frozen dataclasses made as fast as plain ones. Pure: no I/O.

A frozen dataclass's generated `__init__` sets each field through
`object.__setattr__`, past the class's own `__setattr__` that refuses
every change: on Python 3.11 about 80 ns a field, four times a plain
assignment. A cold fill makes two of them for the one answer it
judges (cachenode/fill/judged.py: `Policy` and `Judged`, 16 fields), which
cost a sixth of its judging. `quick_init` gives such a class an `__init__`
that writes each field into the new instance's `__dict__`
instead: the same signature, defaults and instance, and the class as frozen
as before (its `__setattr__` and `__delattr__` are untouched).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TypeVar

_C = TypeVar("_C", bound=type)


def quick_init(cls: _C) -> _C:
    """`cls`, a frozen dataclass, with an `__init__` that writes its fields
    into `__dict__`. Only for the plain kind whose instances that init makes
    whole: a generated `__init__` (not `init=False`'s own), no slots, no
    `__post_init__`, every field an init argument
    without a default factory and not keyword-only, and no other argument
    (an InitVar); TypeError otherwise."""
    params = getattr(cls, "__dataclass_params__", None)
    if (params is None or not params.frozen or not params.init or "__slots__" in vars(cls)
            or hasattr(cls, "__post_init__")):
        raise TypeError(f"{cls.__qualname__} is not a frozen dataclass with a __dict__ and no __post_init__")
    names, defaults = [], {}
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING or f.name in _OWN_NAMES:
            raise TypeError(f"{cls.__qualname__}.{f.name}: quick_init takes plain fields only")
        names.append(f.name)
        if f.default is not dataclasses.MISSING:
            defaults[f"_default_{f.name}"] = f.default
    # The generated __init__ may take more than the fields (an InitVar):
    # one of the fields alone would refuse what it takes.
    if list(inspect.signature(cls.__init__).parameters)[1:] != names:
        raise TypeError(f"{cls.__qualname__}.__init__ takes more than its fields")
    arguments = ", ".join(n if f"_default_{n}" not in defaults else f"{n}=_default_{n}" for n in names)
    # Its own names apart from any field's (a field may be `d`, or `self`,
    # which the generated __init__ too names its instance apart from).
    me = "__quick_self__" if "self" in names else "self"
    body = "".join(f"\n    __quick_dict__[{n!r}] = {n}" for n in names)
    namespace = dict(defaults)
    exec(f"def __init__({me}, {arguments}):\n    __quick_dict__ = {me}.__dict__{body}",
         namespace)  # noqa: S102 - names are fields'
    init = namespace["__init__"]
    init.__module__, init.__qualname__ = cls.__module__, f"{cls.__qualname__}.__init__"
    init.__annotations__ = dict(cls.__init__.__annotations__)
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[misc]
    return cls


# The quick __init__'s own names, which no field may take.
_OWN_NAMES = frozenset({"__quick_self__", "__quick_dict__"})
