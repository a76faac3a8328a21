"""What a node's start imports that it does not use (issue 34, item 8): a node
without a CA imports no cryptography, no process imports PyYAML without a
--config file, and the first process of a node with workers (settings,
lock, exec of the supervisor) no structlog. Each was tens of milliseconds
of every start, several times that on a loaded machine, where the tests
that start nodes wait on them.

Checked by what is loaded, not by a time: a module set does not move with
the machine's load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _loaded(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=60).stdout
    return {m.split(".")[0] for m in json.loads(out.splitlines()[-1])}


def test_the_first_process_of_a_node_with_workers_imports_no_logging_tls_or_yaml_library():
    """Up to the exec of the supervisor: every command's parser, the settings, `nezha cache`'s module."""
    loaded = _loaded("import nezha.cli\nnezha.cli.build_parser()\nimport cachenode.cli, cachenode.workers.supervisor")
    assert not {"structlog", "cryptography", "yaml"} & loaded
    assert "pydantic" in loaded  # it does check the settings


def test_a_node_without_a_ca_imports_no_cryptography():
    loaded = _loaded("import cachenode.app, cachenode.workers.follower, cachenode.workers.primary")
    assert "cryptography" not in loaded
    assert {"aiohttp", "structlog"} <= loaded  # it is the node
