"""The exception tree drawn in nezha/errors.py is the tree the code defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import nezha.errors

PACKAGES = ("nezha", "cachenode", "controller", "webhook")
# One drawn line: tree characters, the class name, its module, then what it means.
LINE = re.compile(r"^ {4}(?P<tree>[ │├└─]*)(?P<name>[A-Z]\w+) +(?P<module>[a-z_][\w.]*)(?::.*)?$")


def defined_exceptions() -> dict[tuple[str, str], type]:
    """Every exception class defined in the four packages, by (module, name)."""
    found = {}
    for package in PACKAGES:
        for info in pkgutil.walk_packages([package], prefix=package + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                    found[(info.name, name)] = obj
    return found


def drawn_parents() -> dict[tuple[str, str], tuple[str, str] | None]:
    """(module, name) -> the (module, name) drawn above it, from the docstring's tree."""
    parents: dict[tuple[str, str], tuple[str, str] | None] = {}
    stack: list[tuple[int, tuple[str, str]]] = []
    for line in nezha.errors.__doc__.splitlines():
        m = LINE.match(line)
        if not m:
            stack = [] if not line.strip() else stack
            continue
        column, node = len(m["tree"]), (m["module"], m["name"])
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[node] = stack[-1][1] if stack else None
        stack.append((column, node))
    return parents


def test_the_tree_parses_into_more_than_its_root():
    """The drawing is read at all (a format change would otherwise pass everything)."""
    parents = drawn_parents()
    assert parents[("nezha.errors", "ConfigError")] == ("nezha.errors", "NezhaError")
    assert len(parents) > 20


def test_every_exception_class_is_drawn_under_its_base():
    """Each class Nezha defines is in the drawing, under the class it derives from first."""
    parents = drawn_parents()
    wrong = {}
    for (module, name), cls in defined_exceptions().items():
        base = cls.__bases__[0]
        expected = (base.__module__, base.__name__)
        if parents.get((module, name), "absent") != expected:
            wrong[f"{module}.{name}"] = f"drawn under {parents.get((module, name), 'nothing: absent')}, " \
                                        f"derives from {expected}"
    assert wrong == {}


def test_every_drawn_class_exists():
    """The drawing names no class that moved or went away (roots from the standard library aside)."""
    defined = defined_exceptions()
    ghosts = [f"{m}.{n}" for (m, n) in drawn_parents() if m != "builtins" and (m, n) not in defined]
    assert ghosts == []
