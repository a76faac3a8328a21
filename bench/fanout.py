"""Fan-out benchmark, hot copies part (issue 27): one hot object read by many clients through every node.

    python bench/fanout.py [--quick]

Runs a 4-node local cluster (real node processes, embedded index, replicas-per-key 2) against an
unthrottled local origin, twice in one run: hot copies off (`--hot-reads 0`) and on (`--hot-reads 3`).
Each time one object is read cold once through its owner, then warmed (a few rounds of reads through
every node, until each non-owner answers `hot-hit` when copies are on), then CLIENTS concurrent curl
processes read it round-robin through the four nodes, and the bytes are attributed to the node whose
disk served them (`X-Nezha-Served-By`, else the node asked). It prints as its last line

    ratios: owner_share_off=<a> owner_share_on=<b> hot_speedup=<s> origin_gets_off=<n> origin_gets_on=<m>

owner_share: bytes served from the two owners' disks / all bytes of the measured round (issue target:
at most 0.55 with copies on, against 1.0 off). hot_speedup: aggregate rate of the measured round with
copies on / off; on this 2-core box the clients, the nodes and the origin share two cores, so it is
bounded by CPU, not by any NIC. origin_gets: the origin's GETs during each run: one cold fill, which for
an object of at least parallel_fill_threshold (64 MiB) is a first GET plus fill_streams (8) ranges, so 1
for the quick 16 MiB object and 9 for 64 MiB; hot copies must add none.

Then the chunked half, in the same run: two more 4-node clusters (R = 1), one storing a 1 GiB object
(--quick: 256 MiB) in 32 chunks (chunk_threshold the object's size, chunk_size 32 MiB; --quick 8 MiB),
one storing it whole (chunk_threshold 0). In each the object is read cold once, then whole three times
(median) through the same node, never the owner of the object's key (so the unchunked read is a relay
from that owner, the chunked one a read of chunks from all four). The ratios line goes on

    chunk_balance=<b> chunked_read=<r> chunked_cold=<c> chunk_origin_gets=<g>

chunk_balance: the largest node's share of the chunked object's bytes on disk (issue target: at most
0.4). chunked_read: the warm whole read's rate chunked / unchunked (issue target: at least 0.7 on this
box). chunked_cold: the same for the cold read (four chunks in flight, each sent by its owner as it
fills, against the unchunked parallel fill's eight ranges). chunk_origin_gets: the origin's GETs
for the chunked object: the first answer plus one per chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import CURL, BenchError, ensure_tool, settled, write_random  # noqa: E402
from nezha.config import Origin  # noqa: E402
from nezha.dev.local_cluster import LocalCluster  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402
from nezha.keys import key_for, parse_target  # noqa: E402
from testkit.ports import free_run  # noqa: E402

HOST = "datasets.bench"
PATH = "/hot.bin"
CHUNKED_PATH = "/chunked.bin"
CLIENTS = 64
FORMAT = "%{http_code} %{size_download} %header{x-nezha-served-by} %header{x-nezha-cache}\\n"


def _curl(url: str, path: str = PATH) -> tuple[int, int, str, str]:
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-H", f"Host: {HOST}", "-w", FORMAT, url + path],
                         capture_output=True, text=True, check=True).stdout.split()
    status, size = int(out[0]), int(out[1])
    served_by = out[2] if len(out) > 3 else ""
    return status, size, served_by, out[-1]


async def curl(url: str, path: str = PATH) -> tuple[int, int, str, str]:
    # curl runs in a thread: the origin shares this event loop and must keep serving.
    return await asyncio.get_running_loop().run_in_executor(None, _curl, url, path)


async def timed_read(url: str, size: int) -> float:
    """Seconds for one whole read of CHUNKED_PATH through `url`, checked complete."""
    started = time.monotonic()
    status, got, _, label = await curl(url, CHUNKED_PATH)
    if status != 200 or got != size:
        raise BenchError(f"read through {url}: {status} ({label}), {got} of {size} bytes")
    return time.monotonic() - started


async def chunk_run(work: Path, origin_url: str, size: int, chunk: int, chunked: bool) -> dict:
    """One 4-node cluster (R = 1) with chunking on or off: the cold read's and the median warm read's
    seconds through one node that does not own the key, and the object's bytes on each node's disk."""
    served_origin = Origin(host=HOST, upstream=origin_url, default_ttl=3600)
    cluster = LocalCluster(nodes=4, origins=[served_origin], data_dir=work / f"chunks-{'on' if chunked else 'off'}",
                           base_port=free_run(4), replicas=1,
                           node_settings={"chunk_threshold": size if chunked else 0, "chunk_size": chunk,
                                          "capacity": "8GiB"})
    try:
        await cluster.start()
        urls = {n.id: n.url for n in cluster.nodes.values()}
        owner = cluster.index.membership.ring().owners(key_for(parse_target(CHUNKED_PATH, HOST), served_origin), 1)[0]
        reader = next(nid for nid in sorted(urls) if nid != owner)
        cold = await timed_read(urls[reader], size)
        await settled(*urls.values())
        warm = sorted([await timed_read(urls[reader], size) for _ in range(3)])[1]
        on_disk = {nid: sum(f.stat().st_size for f in node.data_dir.rglob("*.data"))
                   for nid, node in cluster.nodes.items()}
        return {"cold": cold, "warm": warm, "on_disk": on_disk, "reader": reader, "owner": owner}
    finally:
        await cluster.stop()


async def read_round(urls: dict[str, str], size: int) -> tuple[dict[str, int], float, dict[str, int]]:
    """CLIENTS concurrent reads round-robin over the nodes: bytes per serving node, seconds, labels seen."""
    ids = list(urls)
    started = time.monotonic()
    answers = await asyncio.gather(*(curl(urls[ids[i % len(ids)]]) for i in range(CLIENTS)))
    seconds = time.monotonic() - started
    served = {nid: 0 for nid in ids}
    labels: dict[str, int] = {}
    for i, (status, got, by, label) in enumerate(answers):
        if status != 200 or got != size:
            raise BenchError(f"read {i} through {ids[i % len(ids)]}: {status}, {got} of {size} bytes")
        served[by or ids[i % len(ids)]] += got
        labels[label] = labels.get(label, 0) + 1
    return served, seconds, labels


async def one_run(work: Path, origin: LocalOrigin, origin_url: str, size: int, hot_reads: int) -> dict:
    served_origin = Origin(host=HOST, upstream=origin_url, default_ttl=3600)
    cluster = LocalCluster(nodes=4, origins=[served_origin], data_dir=work / f"cache-{hot_reads}",
                           base_port=free_run(4), replicas=2,
                           node_settings={"hot_reads": hot_reads, "hot_window": 60, "capacity": "8GiB"})
    try:
        await cluster.start()
        urls = {n.id: n.url for n in cluster.nodes.values()}
        owners = cluster.index.membership.ring().owners(key_for(parse_target(PATH, HOST), served_origin), 2)
        others = [nid for nid in urls if nid not in owners]
        await curl(urls[owners[0]])  # cold: the one origin fetch
        await settled(*urls.values())
        deadline = time.monotonic() + 120
        while True:  # warm: replicas copied, and with copies on, every non-owner holding one
            labels = {nid: (await curl(url))[3] for nid, url in urls.items()}
            await settled(*urls.values())
            if all(labels[o] == "hit" for o in owners) and (
                    hot_reads == 0 or all(labels[o] == "hot-hit" for o in others)):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"not warm after 120 s: {labels}")
        served, seconds, seen = await read_round(urls, size)
        total = sum(served.values())
        return {"owner_share": sum(served[o] for o in owners) / total, "rate": total / seconds / 1e6,
                "seconds": seconds, "labels": seen, "served": served, "owners": owners}
    finally:
        await cluster.stop()


async def main(quick: bool) -> None:
    ensure_tool(CURL, "curl")
    size = (16 if quick else 64) * 1024 * 1024
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-fanout-"))
    write_random(work / "origin" / PATH.lstrip("/"), size)
    origin = LocalOrigin(work / "origin")
    try:
        origin_url = await origin.start()
        results = {}
        for hot_reads in (0, 3):
            before = origin.gets
            results[hot_reads] = r = await one_run(work, origin, origin_url, size, hot_reads)
            r["origin_gets"] = origin.gets - before
            print(f"hot copies {'on (--hot-reads 3)' if hot_reads else 'off (--hot-reads 0)'}: {CLIENTS} clients x "
                  f"{size >> 20} MiB round-robin over 4 nodes in {r['seconds']:.2f} s = {r['rate']:.0f} MB/s; "
                  f"owners {r['owners']}; bytes by serving node "
                  f"{ {k: round(v / size) for k, v in r['served'].items()} } objects; labels {r['labels']}",
                  flush=True)
        off, on = results[0], results[3]
        big, chunk = (256 if quick else 1024) * 1024 * 1024, (8 if quick else 32) * 1024 * 1024
        write_random(work / "origin" / CHUNKED_PATH.lstrip("/"), big)
        runs = {}
        for chunked in (False, True):
            before = origin.gets
            runs[chunked] = r = await chunk_run(work, origin_url, big, chunk, chunked)
            r["origin_gets"] = origin.gets - before
            print(f"{big >> 20} MiB object {'in ' + str(big // chunk) + ' chunks' if chunked else 'whole'}, read "
                  f"through {r['reader']} (key owner {r['owner']}): cold {big / r['cold'] / 1e6:.0f} MB/s, warm "
                  f"(median of 3) {big / r['warm'] / 1e6:.0f} MB/s; bytes on disk by node "
                  f"{ {k: round(v / 2**20) for k, v in r['on_disk'].items()} } MiB; origin GETs {r['origin_gets']}",
                  flush=True)
        whole, chunks = runs[False], runs[True]
        print(f"ratios: owner_share_off={off['owner_share']:.3f} owner_share_on={on['owner_share']:.3f} "
              f"hot_speedup={on['rate'] / off['rate']:.3f} origin_gets_off={off['origin_gets']} "
              f"origin_gets_on={on['origin_gets']} "
              f"chunk_balance={max(chunks['on_disk'].values()) / sum(chunks['on_disk'].values()):.3f} "
              f"chunked_read={whole['warm'] / chunks['warm']:.3f} chunked_cold={whole['cold'] / chunks['cold']:.3f} "
              f"chunk_origin_gets={chunks['origin_gets']}")
    finally:
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 16 MiB hot object instead of 64 MiB, a 256 MiB "
                        "chunked one instead of 1 GiB")
    a = parser.parse_args()
    try:
        asyncio.run(main(a.quick))
    except BenchError as e:
        sys.exit(f"fanout: {e}")
