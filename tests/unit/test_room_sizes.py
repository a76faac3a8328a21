"""The measures of a room that fits what it holds (docs/architecture.md):
a module of the cache node at most 450 lines, any other module at most 500,
a function at most 60, and `Handler.handle`, the one door every request
comes through, at most 40. Features landing in a hub grew it back twice;
this makes the next one split it as it lands."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cachenode", "controller", "nezha", "webhook", "testkit")
CACHENODE_MODULE, MODULE, FUNCTION, HANDLE = 450, 500, 60, 40


def _modules() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _functions(source: str):
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_every_module_fits_its_limit():
    over = {path: len(source.splitlines()) for path, source in _modules().items()
            if len(source.splitlines()) > (CACHENODE_MODULE if path.startswith("cachenode/") else MODULE)}
    assert over == {}, f"split by what each part holds (cachenode/ <= {CACHENODE_MODULE} lines, else <= {MODULE})"


def test_every_function_fits_in_sixty_lines():
    over = [f"{path}:{line} {name} ({n} lines)" for path, source in _modules().items()
            for name, line, n in _functions(source) if n > FUNCTION]
    assert over == [], "put these in named steps"


def test_the_handler_s_door_stays_short():
    source = (ROOT / "cachenode/front/handler.py").read_text()
    lengths = {name: n for name, _, n in _functions(source)}
    assert lengths["handle"] <= HANDLE


@pytest.mark.parametrize("source,expected", [
    ("def f():\n" + "    x = 1\n" * 60, 61),
    ("class A:\n    async def g(self):\n        pass\n", 2),
])
def test_a_function_is_measured_from_its_def_to_its_last_line(source, expected):
    assert [n for _, _, n in _functions(source)] == [expected]
