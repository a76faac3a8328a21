"""Every collaborator of the cache node's rooms is passed to the constructor
that needs it: no callable is set on another object after it is built.

A callable assigned after construction (`engine.forget_chunks = ...`) is a
call path the import checker cannot see: a room below ends up calling one
above at run time while its imports still go down. So `cachenode/` is read
with `ast`, and every assignment to an attribute of an object other than
`self` is checked: it fails when the attribute is one a class of the node
declares as holding a callable (`x: Callable[...]`), or when what is
assigned is a lambda, a function defined in the same module, a
`functools.partial`, or a method of the assigning class (`self.method`).
A bound method of another object set on an attribute no class declares
(`engine.later = invalidation.forget`) cannot be told from data by name:
tests/integration/cachenode/test_no_wiring_at_run_time.py watches a running
node for it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

CACHENODE = Path(__file__).resolve().parents[3] / "cachenode"

# Library objects whose method one exchange shadows: not a room of the node,
# and built by the library, so there is no constructor to pass anything to.
LIBRARY_PATCHES = {
    ("fill/origin.py", "protocol.read"):
        "aiohttp's response protocol of a pooled connection: its read is shadowed for one exchange, to hear "
        "the origin's interim (1xx) answers",
    ("kernel/splice.py", "transport.resume_reading"):
        "asyncio's transport of a spliced connection: a pooled connection's earlier reader must never "
        "resume it",
}

def _assignments(tree: ast.AST):
    """(node, target, value) of every assignment to an attribute in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute):
                yield node, target, value


def declared_callables(trees: list[ast.AST]) -> set[str]:
    """Names of the attributes a class declares as holding a callable (`self.x: Callable[...]`, `x: Callable[...]`)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and "Callable" in ast.unparse(node.annotation):
                if isinstance(node.target, ast.Attribute):
                    names.add(node.target.attr)
                elif isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    return names


def _is_partial(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func) in ("partial", "functools.partial")


def _own_bound_methods(tree: ast.AST) -> set[int]:
    """Ids of the `self.<method>` expressions in `tree` that name a method (not a property) of their class:
    bound methods, whatever the attribute they are set on is called."""
    found = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and not any("property" in ast.unparse(d) or ast.unparse(d).endswith(".setter")
                               for d in f.decorator_list)}
        found |= {id(n) for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id == "self" and n.attr in methods}
    return found


def wired_after_construction(tree: ast.AST, callables: set[str]) -> list[tuple[int, str]]:
    """(line, source) of each callable set on an object other than `self` or `cls`."""
    defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bound = _own_bound_methods(tree)
    found = []
    for node, target, value in _assignments(tree):
        if isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"):
            continue
        if (target.attr in callables or isinstance(value, ast.Lambda) or _is_partial(value)
                or (isinstance(value, ast.Name) and value.id in defs) or id(value) in bound):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


@functools.cache
def _modules() -> dict[str, ast.AST]:
    return {str(p.relative_to(CACHENODE)): ast.parse(p.read_text(), filename=str(p))
            for p in sorted(CACHENODE.rglob("*.py"))}


def test_no_callable_is_set_on_another_object_after_it_is_built_anywhere_in_the_cache_node():
    modules = _modules()
    callables = declared_callables(list(modules.values()))
    found = [f"cachenode/{path}:{line}: {source}"
             for path, tree in modules.items()
             for line, source in wired_after_construction(tree, callables)
             if (path, source.split(" = ")[0]) not in LIBRARY_PATCHES]
    assert found == [], "pass these to the constructor that needs them:\n" + "\n".join(found)


def test_every_assignment_let_through_is_still_there():
    """An entry whose assignment is gone would let a new one of that name through unseen."""
    modules = _modules()
    seen = {(path, source.split(" = ")[0])
            for path, tree in modules.items()
            for _, source in wired_after_construction(tree, declared_callables(list(modules.values())))}
    assert set(LIBRARY_PATCHES) <= seen


# The seven assignments front/handler.py made before the chunks got a room
# (cachenode/chunks/), the replicate hook and the metrics hook: each must be found.
BEFORE = '''
class Responder:
    def __init__(self):
        self.chunk_body: Callable[[int], Awaitable[None]] | None = None

class FillEngine:
    def __init__(self):
        self.forget_chunks: Callable[[str], Awaitable[int]] = _no_chunks

class Handler:
    def __init__(self, respond, engine, invalidation, handoff, cluster):
        self.before_metrics: Callable[[], Awaitable[None]] | None = None
        respond.chunk_body = self.chunks.send
        engine.chunks_spread = lambda: len(cluster.snapshot.nodes) > 1
        engine.forget_chunks = self.chunks.drop_chunks
        self.chunks.tell_old_chunks = invalidation.tell_old_chunks
        handoff.chunk_handoff = functools.partial(self.chunks.hand_off)

def attach(node, followers):
    def counted():
        pass
    node.handler.before_metrics = followers.counted
    node.engine.replicate = counted
    node.supervisor = os.getppid()
'''


def test_the_check_finds_callables_set_on_other_objects_and_nothing_else():
    tree = ast.parse(BEFORE)
    found = [source for _, source in wired_after_construction(tree, declared_callables([tree]) | {
        "tell_old_chunks"})]
    assert found == [
        "respond.chunk_body = self.chunks.send",
        "engine.chunks_spread = lambda: len(cluster.snapshot.nodes) > 1",
        "engine.forget_chunks = self.chunks.drop_chunks",
        "self.chunks.tell_old_chunks = invalidation.tell_old_chunks",
        "handoff.chunk_handoff = functools.partial(self.chunks.hand_off)",
        "node.handler.before_metrics = followers.counted",
        "node.engine.replicate = counted",
    ]


def test_the_check_finds_a_method_of_the_assigning_class_set_on_another_object_under_any_name():
    source = """
class Chunks:
    def send(self):
        pass

    @property
    def size(self):
        return 1

    def attach(self, respond, engine):
        respond.later = self.send
        engine.size = self.size
        self.again = self.send
"""
    assert [s for _, s in wired_after_construction(ast.parse(source), set())] == ["respond.later = self.send"]


@pytest.mark.parametrize("source", [
    "self.on_done = lambda: None",
    "self.store = store",
    "node.supervisor = os.getppid()",
    "temp.reserved = size",
])
def test_an_object_setting_its_own_callable_or_another_object_setting_data_is_no_wiring(source):
    assert wired_after_construction(ast.parse(source), {"on_done"}) == []
