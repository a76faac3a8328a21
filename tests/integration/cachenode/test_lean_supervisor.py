"""The supervisor of a node's workers imports only what starting, watching and
restarting them needs (issue 33, item 6): the standard library, the typed
messages, the restart plan and the log lines; never pydantic, aiohttp,
structlog, prometheus or the node. It was a whole node process (69 MiB
idle, as much as a worker); now it is about 16 MiB.

Checked by what is loaded, not by a size: a module set does not move with
the machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testkit.ports import free_port
from testkit.waits import wait_for
from testkit.logs import log_events

ROOT = Path(__file__).resolve().parents[3]
# Ours that the supervisor may import: everything else it imports is the standard library's.
OURS = {"cachenode", "cachenode.workers", "cachenode.workers.supervisor", "cachenode.workers.messages",
        "cachenode.workers.plan", "cachenode.workers.log_lines", "nezha", "nezha.errors", "nezha.localproc"}


def test_the_supervisor_module_imports_only_the_standard_library_and_its_own_few_modules():
    code = ("import json, sys; before = set(sys.modules); import cachenode.workers.supervisor; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       cwd=ROOT, timeout=60).stdout)
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names and m not in OURS]
    assert foreign == []
    assert not {"asyncio", "nezha.config", "cachenode.app"} & set(loaded)


async def test_a_running_supervisor_maps_no_third_party_extension_while_its_workers_do(tmp_path, origin):
    """Its pid is the command's (it is exec'd into, so signals and `nezha up`
    still reach it), and it loaded no compiled module from site-packages
    (pydantic_core, aiohttp's parser, cryptography, ...)."""
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
             str(tmp_path / "data"), "--origin", f"datasets.example={origin.url}", "--workers", "2"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def events(name: str) -> list[dict]:
        return log_events(log, name)

    def third_party(pid: int) -> set[str]:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        return {line.split()[-1] for line in maps if "site-packages" in line and ".so" in line}

    try:
        await wait_for(lambda: events("node_listening") and events("worker_listening"), timeout=60)
        assert "cachenode.workers.supervisor" in Path(f"/proc/{proc.pid}/cmdline").read_text()
        assert third_party(proc.pid) == set(), f"VmRSS of the supervisor: {Path(f'/proc/{proc.pid}/status').read_text()}"
        workers = [e["pid"] for e in events("worker_started")]
        assert all(any("pydantic_core" in so for so in third_party(pid)) for pid in workers)
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
