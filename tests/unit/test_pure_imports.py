"""Pure modules (no I/O) import no network, cluster or Redis client library.

Each module is imported in a fresh interpreter, so what another test already
imported cannot hide a dependency.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_MODULES = ["nezha.ring", "cachenode.freshness", "cachenode.vary", "controller.annotations", "controller.membership", "controller.status", "controller.autoscale"]
FORBIDDEN = {"aiohttp", "redis", "fakeredis", "kubernetes_asyncio", "structlog", "socket", "asyncio"}


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
