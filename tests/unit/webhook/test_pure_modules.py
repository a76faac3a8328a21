"""The webhook's pure cores import no network, cluster or logging library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"aiohttp", "redis", "kubernetes_asyncio", "structlog", "socket", "asyncio", "ssl"}


@pytest.mark.parametrize("module", ["webhook.patch", "webhook.rules", "webhook.ops", "webhook.containers", "webhook.review",
                                    "webhook.sidecar"])
def test_pure_webhook_module_imports_no_io_library(module):
    script = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    assert "webhook" in loaded
    assert loaded & FORBIDDEN == set()
