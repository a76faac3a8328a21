"""The tools the tests drive for real (redis-server, helm, kubectl, curl, ...), and what a missing one means.

On a developer's machine a missing tool skips the tests that need it. In CI
(`CI=true`) it fails them: a green run must mean the tests ran, and `.ci/run`
installs every tool, so a missing one there is a broken setup, not a reason
to skip.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Where .ci/run puts the pinned helm and kubectl; searched before PATH.
TOOLS_BIN = Path(__file__).resolve().parents[1] / ".tools" / "bin"


def unavailable(msg: str) -> None:
    """Something a test needs is not here: skip locally, fail in CI. Never returns."""
    if IN_CI:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def require_tool(name: str) -> str:
    """Path of executable `name`; skip locally, fail in CI, when it is missing.

    `.tools/bin` (where `.ci/run` puts the pinned helm and kubectl) comes before PATH.
    """
    path = shutil.which(name, path=str(TOOLS_BIN)) or shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (bash .ci/run installs it)")
    return path
