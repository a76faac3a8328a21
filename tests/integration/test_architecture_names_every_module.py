"""`docs/architecture.md` names every module of the cache node and of the shared base, and nothing else.

The architecture page is where a newcomer looks for the room a piece of code
lives in. A module left out of its trees is one nobody finds there (the
page once omitted `workers/`, a layer of its own, and fourteen modules); a
module it still names after a move sends the reader to a file that is gone.
So the two trees (the cache node's rooms, the shared base's rooms) are read
as a listing: one module or package per line, its name first, then what it
holds, nested by indentation. Every `.py` file under `cachenode/` and
`nezha/` but `__init__.py` must have its line, and every line must name a
file or folder that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# An entry: its indentation, then a module (`app.py`) or a package (`front/`), then what it holds.
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[a-z_][a-z0-9_]*(?:\.py|/))(?:\s{2,}\S.*)?$")
TREES = {"cachenode": "The cache node's rooms", "nezha": "The shared base's rooms"}


def tree_under(heading: str, markdown: str) -> str:
    """The first fenced block after the heading whose text is `heading`."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and tokens[i + 1].content == heading:
            return next(t.content for t in tokens[i + 1:] if t.type == "fence")
    raise AssertionError(f"docs/architecture.md has no section {heading!r}")


def entries(tree: str) -> tuple[set[str], list[str]]:
    """(paths the tree names, lines that are no entry): `front/` nested under `cachenode/` is
    `cachenode/front/`, `handler.py` under it `cachenode/front/handler.py`."""
    named: set[str] = set()
    bad: list[str] = []
    stack: list[tuple[int, str]] = []  # (indent, package path) of the packages the next line may sit in
    for line in tree.splitlines():
        if not line.strip():
            continue
        m = ENTRY.match(line)
        if m is None:
            bad.append(line)
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + m["name"]
        named.add(path)
        if path.endswith("/"):
            stack.append((indent, path))
    return named, bad


def modules_of(package: str) -> set[str]:
    """Every module and sub-package of `package`, as paths from the repository root; __init__.py is its package."""
    base = ROOT / package
    found = {f"{package}/"}
    for path in base.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        found.add(rel.rsplit("/", 1)[0] + "/" if path.name == "__init__.py" else rel)
    return found


# -- the reader's own parts ---------------------------------------------------------------------------------

def test_a_tree_is_read_by_indentation_and_a_line_that_is_no_entry_is_caught():
    tree = ("pkg/          the package\n"
            "  top.py      a module\n"
            "  sub/        a sub-package\n"
            "    deep.py   its module\n"
            "  after.py    back at the top\n"
            "  prose that continues a line\n")
    named, bad = entries(tree)
    assert named == {"pkg/", "pkg/top.py", "pkg/sub/", "pkg/sub/deep.py", "pkg/after.py"}
    assert bad == ["  prose that continues a line"]


def test_the_first_fenced_block_under_the_heading_is_the_tree():
    page = "# Page\n\n## Rooms\n\ntext\n\n```\npkg/\n  a.py  one\n```\n\n```\nother/\n```\n"
    assert tree_under("Rooms", page) == "pkg/\n  a.py  one\n"
    with pytest.raises(AssertionError, match="no section 'Elsewhere'"):
        tree_under("Elsewhere", page)


# -- the page ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("package", sorted(TREES))
def test_the_architecture_page_names_every_module_of_the_package(package):
    named, bad = entries(tree_under(TREES[package], ARCHITECTURE.read_text()))
    assert not bad, (f"lines of the {TREES[package]!r} tree that are no entry (one module or package per "
                     "line: its name, two spaces, what it holds):\n" + "\n".join(bad))
    missing = sorted(modules_of(package) - named)
    assert not missing, (f"docs/architecture.md, {TREES[package]!r}, does not name these (add a line each, "
                         "saying what it holds):\n" + "\n".join(missing))


@pytest.mark.parametrize("package", sorted(TREES))
def test_every_module_the_architecture_page_names_exists(package):
    named, _ = entries(tree_under(TREES[package], ARCHITECTURE.read_text()))
    gone = sorted(named - modules_of(package))
    assert not gone, (f"docs/architecture.md, {TREES[package]!r}, names what does not exist (moved or "
                      "removed: update its line):\n" + "\n".join(gone))
