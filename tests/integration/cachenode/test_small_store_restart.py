"""A node holding 100,000 small objects (one sealed file each) costs at most
300 bytes of memory per object, answers its first hit within a second of
its start, and serves every object exact once its index is loaded
(docs/cache-node.md "Memory per object"; bench/small_index.py measures the
same at a million objects)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cachenode.store.disk import Store
from cachenode.store.layout import place_small
from cachenode.store.objects import Meta

# A guard against a hang, not a bound on what is measured: building 100,000
# files and loading them twice takes 30 s on a quiet box, 2 minutes on a loaded one.
pytestmark = pytest.mark.timeout(400)

HOST = "www.cs.toronto.edu"
COUNT = 100_000
BYTES_PER_OBJECT = 300  # the target, at a million objects: a bound here too

# Run in a fresh interpreter, so that nothing else this test process holds is counted.
MEASURE = """
import asyncio, gc, json, sys
from pathlib import Path
from cachenode.store.disk import Store

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

async def main():
    store = Store(Path(sys.argv[1]))
    gc.collect()
    before = rss()
    await store.open(background=True)
    await store.loaded()
    await store.close()
    gc.collect()
    print(json.dumps({"objects": len(store), "grew": rss() - before}))

asyncio.run(main())
"""


def key(i: int) -> str:
    return f"http://{HOST}/imagenet/train/{i:07d}.JPEG"


def body(i: int) -> bytes:
    return f"{i:07d}".encode() * 32


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """COUNT sealed small objects of 224 bytes, written with the store's own writer (without sync)."""
    root = tmp_path_factory.mktemp("small")
    now = time.time()
    headers = (("Content-Type", "image/jpeg"),)
    written = place_small(root / "objects", (
        (Meta(key=key(i), url=key(i), host=HOST, size=0, headers=headers + (("ETag", f'"{i:x}"'),),
              stored_at=now, expires_at=now + 86400), body(i)) for i in range(COUNT)))
    assert written == COUNT
    return root


def test_a_node_holds_100k_small_objects_in_at_most_300_bytes_of_memory_each(small_store):
    """Measured as the growth of a process's resident memory from an empty index to the loaded one."""
    out = subprocess.run([sys.executable, "-c", MEASURE, str(small_store)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["objects"] == COUNT
    per_object = measured["grew"] / COUNT
    assert per_object <= BYTES_PER_OBJECT, f"{per_object:.0f} bytes of memory per stored object"


async def test_a_restarted_node_with_100k_small_objects_hits_within_a_second_and_serves_each_exact(
        small_store, make_node, session, origin):
    started = time.monotonic()
    node = await make_node(data_dir=small_store)
    status, headers, got = await node.get(session, "/imagenet/train/0099999.JPEG")
    first_hit = time.monotonic() - started
    assert status == 200 and got == body(99_999) and headers["X-Nezha-Cache"] == "hit"
    assert first_hit < 1.0, first_hit
    store: Store = node.node.store
    await store.loaded()
    assert len(store) == COUNT and store.load_progress == 1.0
    for i in range(COUNT):
        meta = store.lookup(key(i))
        assert meta is not None, i
        fd = os.open(store.data_path(meta), os.O_RDONLY)
        try:
            assert store.intact(meta, fd) and os.pread(fd, meta.size, 0) == body(i), i
        finally:
            os.close(fd)
    status, _, got = await node.get(session, "/imagenet/train/0000000.JPEG")
    assert status == 200 and got == body(0)
    assert sum(origin.requests.values()) == 0
