"""The project's byte code, compiled once before a run that starts many processes.

Where Python is told not to write byte code (PYTHONDONTWRITEBYTECODE, set
in this repository's own image and in many CI and container environments),
every process compiles each project module it imports from source, every
time: a `nezha cache` node imports about a hundred of them, and the suite
starts hundreds of nodes, several at once. That was a sixth of a node's
start at rest (0.16 s of 1.0 s, cProfile's `source_to_code`) and more on a
loaded machine, where the tests that start nodes wait on them. The installed
packages are compiled by pip already; an editable install's are not.

`compile_project` writes the byte code Python would have written itself on
first import; the environment variable still holds for every process (none
writes), and the files are the `__pycache__/` folders git ignores.
"""

from __future__ import annotations

import compileall
import sys
from pathlib import Path

PACKAGES = ("nezha", "cachenode", "controller", "webhook", "testkit")


def compile_project(root: Path, *, packages: tuple[str, ...] = PACKAGES) -> bool:
    """Compile `packages` under `root` when this Python writes no byte code
    by itself; True when it did (up-to-date files are skipped). A folder it
    cannot write to is left as it is: the processes compile as before."""
    if not sys.dont_write_bytecode:
        return False  # the first import of each module writes it
    for name in packages:
        folder = root / name
        if folder.is_dir():
            compileall.compile_dir(folder, quiet=2)
    return True
