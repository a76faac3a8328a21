"""`nezha verify --data-dir DIR`: a stopped node's store checked offline (issue 37 item 3).

A real node process stores objects, large and small; it stops; a byte flips
on disk; `nezha verify` names the bad object and exits 1, 0 when all are
whole, and 2 with a clear error for a folder that is no node's."""

from __future__ import annotations

import subprocess
import sys

import aiohttp

from tests.integration.cachenode.conftest import HOST, flip_byte, key_of

MiB = 1 << 20
LARGE = bytes(range(256)) * (2 * MiB // 256)
SMALL = b"a small object" * 100


def verify(data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nezha", "verify", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)



async def filled_store(origin, node_process) -> "object":
    origin.put("/large/a.bin", LARGE)
    origin.put("/large/b.bin", LARGE[::-1])
    origin.put("/small/c.txt", SMALL)
    node = node_process(origin.url)
    async with aiohttp.ClientSession() as session:
        await node.ready(session)
        for path in ("/large/a.bin", "/large/b.bin", "/small/c.txt"):
            for _ in range(20):  # until its fill committed: a hit
                async with session.get(f"http://127.0.0.1:{node.port}{path}", headers={"Host": HOST}) as r:
                    assert r.status == 200
                    await r.read()
                    if r.headers["X-Nezha-Cache"] == "hit":
                        break
    node.stop()
    return node


async def test_a_store_with_one_flipped_byte_in_a_large_object_names_it_and_exits_1(origin, node_process):
    node = await filled_store(origin, node_process)
    whole = verify(node.data_dir)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "3 objects" in whole.stdout and "0 bad" in whole.stdout

    metas = {p: p.read_text() for p in node.data_dir.rglob("*.meta")}
    [(meta_path, _)] = [(p, t) for p, t in metas.items() if "/large/a.bin" in t]
    [data] = [p for p in meta_path.parent.glob("*.data") if p.name.startswith(meta_path.stem)]
    flip_byte(data, MiB + 100)
    found = verify(node.data_dir)
    assert found.returncode == 1, found.stdout + found.stderr
    [bad] = [line for line in found.stdout.splitlines() if line.startswith("bad: ")]
    assert str(data) in bad and f"key={key_of('/large/a.bin')}" in bad and "block 1 " in bad, bad
    assert "1 bad" in found.stdout


async def test_a_torn_small_object_is_named_too(origin, node_process):
    node = await filled_store(origin, node_process)
    [small] = list(node.data_dir.rglob("*.obj"))
    flip_byte(small, 3)
    found = verify(node.data_dir)
    assert found.returncode == 1, found.stdout + found.stderr
    [bad] = [line for line in found.stdout.splitlines() if line.startswith("bad: ")]
    assert str(small) in bad and "seal" in bad, bad


def test_a_missing_folder_is_a_clear_error(tmp_path):
    gone = verify(tmp_path / "nowhere")
    assert gone.returncode == 2
    assert f"data folder {tmp_path / 'nowhere'} does not exist" in gone.stderr, gone.stderr
    (tmp_path / "other").mkdir()
    other = verify(tmp_path / "other")
    assert other.returncode == 2 and "no objects/ folder" in other.stderr, other.stderr
