"""Pure modules (no I/O) import no network, cluster or Redis client library.

The list of pure modules is written once, in the import-linter contract of
pyproject.toml, which `lint-imports` checks statically in .ci/run. These
tests check what a static graph cannot: each module is imported in a fresh
interpreter, so a dynamic import, or what another test already imported,
cannot hide a dependency; and a module whose docstring calls itself pure is
on the list.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nezha", "cachenode", "controller", "webhook")


def _contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["type"] == "forbidden" and "Pure" in c["name"])


PURE = _contract()
PURE_MODULES = PURE["source_modules"]
FORBIDDEN = set(PURE["forbidden_modules"])
# The claim: the word "pure" in any case ("Pure: no I/O.", "(pure)"), not a part of
# another word or a compound ("purely", "impure", "non-pure", "pure-Python").
CLAIM = re.compile(r"(?<![\w-])pure(?![\w-])", re.IGNORECASE)


def _declared_pure() -> list[str]:
    """Modules whose docstring's first paragraph says "pure" (CLAIM)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if CLAIM.search(doc.split("\n\n", 1)[0]):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append(module.removesuffix(".__init__"))
    return found


def test_every_module_that_says_it_is_pure_is_in_the_contract():
    """A module calling itself pure is checked as pure."""
    assert _declared_pure(), "no module declares itself pure: the docstring scan is broken"
    assert sorted(set(_declared_pure()) - set(PURE_MODULES)) == []


@pytest.mark.parametrize("text, claims", [
    ("Request targets and cache keys. Pure: no I/O.", True),
    ("The index's Redis URLs (pure): which forms every command takes", True),
    ("HTTP semantics of a shared cache, pure: what may be stored", True),
    ("PURE core of the webhook", True),
    ("Impure: it writes the ring to Redis.", False),
    ("Purely a wrapper around the Redis client.", False),
    ("A non-pure helper beside a pure-Python parser.", False),
])
def test_the_claim_is_the_word_pure_in_any_case(text, claims):
    assert bool(CLAIM.search(text)) is claims


def test_every_module_in_the_contract_exists():
    """The contract names no module that moved or went away (a package is its __init__.py)."""
    missing = [m for m in PURE_MODULES if not (ROOT / Path(*m.split("."))).with_suffix(".py").is_file()
               and not (ROOT / Path(*m.split(".")) / "__init__.py").is_file()]
    assert missing == []


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module):
    script = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    assert module.split(".")[0] in loaded  # the import really happened
    assert loaded & FORBIDDEN == set()
