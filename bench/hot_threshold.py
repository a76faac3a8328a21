"""Hot-copy threshold sweep (issue 27, part 1): which `--hot-reads` default serves a hot object from
every node soon enough without copying objects nobody reads again.

    python bench/hot_threshold.py [--reads 1,2,4,8,16] [--seed 27] [--wave 8]

For each `--hot-reads` value (and 0, copies off, the reference), one 4-node local cluster (real node
processes, embedded index, replicas-per-key 2, `--hot-window 60`) in front of an unthrottled local origin
runs two workloads, both from a cold cache:

- hot: one 4 MiB object read 64 times round-robin through the four nodes in 8 waves of 8 concurrent
  reads (`--wave 4`: 16 waves of 4), one wave after the other (a Job's pods starting over a spread, not
  all at once). A wave of 8 reads each node twice, so thresholds that differ by one within a pair tie.
  `owner_share`: bytes served from the two owners' disks / all bytes (1.0 with copies off; 0.5 is
  every node serving its own clients from the first read on, which no threshold reaches from cold).
- mixed: 96 objects of 1 MiB, each read 1 (45 %), 2 (40 %), 3 (10 %) or 6 (5 %) times through a node
  picked at random (seeded), all reads shuffled together, 8 in flight: most objects are read once or
  twice. `wasted`: bytes of hot copies made during it that then served no read at all (copied for
  nothing) / all bytes the clients read; `copied`: all hot-copy bytes made / all bytes read.
  `mixed_owner_share`: as above, for these reads.

Bytes on each node's disk by `X-Nezha-Served-By` (a relay names the owner, a hot copy its own node),
hot copies counted from the nodes' `.meta` files ("hot": true). Every body is checked for its length.
One line per value, then

    sweep: reads=<n>:owner_share=<a>,wasted=<w>,copied=<c>,mixed_owner_share=<m> ...

The objects are small to keep the sweep short on a shared 2-core box: the byte ratios depend on how
many reads and copies happen, not on the object's size, and a small copy lands before the next wave,
as a large one on a real NIC lands within seconds (docs/capacity.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BenchError, settled, write_random  # noqa: E402
from nezha.config import Origin  # noqa: E402
from nezha.dev.local_cluster import LocalCluster  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402
from nezha.keys import key_for, parse_target  # noqa: E402
from testkit.ports import free_run  # noqa: E402

HOST = "datasets.bench"
HOT_PATH = "/hot/object.bin"
HOT_SIZE = 4 << 20
CLIENTS = 64
MIXED_OBJECTS, MIXED_SIZE = 96, 1 << 20
READ_COUNTS = [(1, 0.45), (2, 0.40), (3, 0.10), (6, 0.05)]
IN_FLIGHT = 8


async def read(session: aiohttp.ClientSession, url: str, path: str, size: int) -> tuple[str, str]:
    """One whole GET through `url`, checked for its length: (serving node, X-Nezha-Cache)."""
    got = 0
    async with session.get(url + path, headers={"Host": HOST}) as r:
        async for chunk in r.content.iter_chunked(1 << 20):
            got += len(chunk)
        if r.status != 200 or got != size:
            raise BenchError(f"GET {path} through {url}: {r.status}, {got} of {size} bytes")
        return r.headers.get("X-Nezha-Served-By", ""), r.headers.get("X-Nezha-Cache", "")


def hot_copies(cluster: LocalCluster) -> dict[tuple[str, str], int]:
    """(node, key) -> bytes of every hot copy on the nodes' disks."""
    found = {}
    for nid, node in cluster.nodes.items():
        for meta_path in node.data_dir.rglob("*.meta"):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("hot"):
                found[(nid, meta["key"])] = meta["size"]
    return found


def mixed_plan(rng: random.Random, nodes: list[str]) -> list[tuple[str, str]]:
    """(path, node) for every read of the mixed workload, shuffled."""
    plan = []
    for i in range(MIXED_OBJECTS):
        count = rng.choices([c for c, _ in READ_COUNTS], weights=[w for _, w in READ_COUNTS])[0]
        plan += [(f"/mixed/{i}.bin", rng.choice(nodes)) for _ in range(count)]
    rng.shuffle(plan)
    return plan


async def one_value(work: Path, origin_url: str, hot_reads: int, seed: int, wave_size: int) -> dict:
    served_origin = Origin(host=HOST, upstream=origin_url, default_ttl=3600)
    cluster = LocalCluster(nodes=4, origins=[served_origin], data_dir=work / f"cache-{hot_reads}",
                           base_port=free_run(4), replicas=2,
                           node_settings={"hot_reads": hot_reads, "hot_window": 60, "capacity": "4GiB"})
    try:
        await cluster.start()
        urls = {n.id: n.url for n in cluster.nodes.values()}
        ids = sorted(urls)
        ring = cluster.index.membership.ring()

        def owners(path: str) -> list[str]:
            return list(ring.owners(key_for(parse_target(path, HOST), served_origin), 2))

        async with aiohttp.ClientSession() as session:
            # Hot: waves of concurrent reads, round-robin.
            hot_owners = owners(HOT_PATH)
            served: dict[str, int] = {nid: 0 for nid in ids}
            labels: dict[str, int] = {}
            started = time.monotonic()
            for wave in range(CLIENTS // wave_size):
                answers = await asyncio.gather(*(read(session, urls[ids[(wave * wave_size + i) % len(ids)]],
                                                      HOT_PATH, HOT_SIZE) for i in range(wave_size)))
                for i, (by, label) in enumerate(answers):
                    served[by or ids[(wave * wave_size + i) % len(ids)]] += HOT_SIZE
                    labels[label] = labels.get(label, 0) + 1
            hot_seconds = time.monotonic() - started
            await settled(*urls.values())
            owner_share = sum(served[o] for o in hot_owners) / sum(served.values())
            hot_copy_bytes = sum(hot_copies(cluster).values())

            # Mixed: most objects read once or twice, through random nodes.
            before = set(hot_copies(cluster))
            plan = mixed_plan(random.Random(seed), ids)
            gate = asyncio.Semaphore(IN_FLIGHT)
            hot_hits: dict[tuple[str, str], int] = {}
            mixed_owner_bytes = 0

            async def one(path: str, nid: str) -> None:
                nonlocal mixed_owner_bytes
                async with gate:
                    by, label = await read(session, urls[nid], path, MIXED_SIZE)
                if label == "hot-hit":
                    k = (by, f"http://{HOST}{path}")
                    hot_hits[k] = hot_hits.get(k, 0) + 1
                if (by or nid) in owners(path):
                    mixed_owner_bytes += MIXED_SIZE

            await asyncio.gather(*(one(path, nid) for path, nid in plan))
            await settled(*urls.values())
            made = {k: v for k, v in hot_copies(cluster).items() if k not in before}
            mixed_bytes = len(plan) * MIXED_SIZE
            wasted = sum(v for k, v in made.items() if not hot_hits.get(k))
        return {"owner_share": owner_share, "hot_labels": labels, "hot_seconds": hot_seconds,
                "hot_copy_bytes": hot_copy_bytes, "wasted": wasted / mixed_bytes,
                "copied": sum(made.values()) / mixed_bytes, "copies": len(made),
                "mixed_owner_share": mixed_owner_bytes / mixed_bytes, "mixed_reads": len(plan),
                "mixed_hot_hits": sum(hot_hits.values())}
    finally:
        await cluster.stop()


async def main(values: list[int], seed: int, wave_size: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-hot-threshold-"))
    write_random(work / "origin" / HOT_PATH.lstrip("/"), HOT_SIZE)
    for i in range(MIXED_OBJECTS):
        write_random(work / "origin" / "mixed" / f"{i}.bin", MIXED_SIZE)
    origin = LocalOrigin(work / "origin")
    try:
        origin_url = await origin.start()
        results = {}
        for hot_reads in [0, *values]:
            before = origin.gets
            results[hot_reads] = r = await one_value(work, origin_url, hot_reads, seed, wave_size)
            r["origin_gets"] = origin.gets - before
            print(f"--hot-reads {hot_reads}: hot object owner_share {r['owner_share']:.3f} "
                  f"({CLIENTS // wave_size} waves of {wave_size}, {r['hot_seconds']:.2f} s, labels {r['hot_labels']}, "
                  f"{r['hot_copy_bytes'] >> 20} MiB copied); mixed: {r['mixed_reads']} reads of "
                  f"{MIXED_OBJECTS} objects, {r['copies']} hot copies made, {r['mixed_hot_hits']} reads served "
                  f"from them, copied {r['copied']:.3f} and wasted {r['wasted']:.3f} of the bytes read, "
                  f"owner_share {r['mixed_owner_share']:.3f}; origin GETs {r['origin_gets']}", flush=True)
        print("sweep: " + " ".join(
            f"reads={v}:owner_share={r['owner_share']:.3f},wasted={r['wasted']:.3f},copied={r['copied']:.3f},"
            f"mixed_owner_share={r['mixed_owner_share']:.3f}" for v, r in results.items()))
    finally:
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", default="1,2,4,8,16", help="the --hot-reads values to sweep (0 always runs)")
    parser.add_argument("--seed", type=int, default=27, help="the mixed workload's random seed")
    parser.add_argument("--wave", type=int, default=8, choices=[1, 2, 4, 8, 16, 32, 64],
                        help="concurrent reads of the hot object per wave (64 reads in all)")
    a = parser.parse_args()
    try:
        asyncio.run(main([int(v) for v in a.reads.split(",") if v.strip()], a.seed, a.wave))
    except BenchError as e:
        sys.exit(f"hot_threshold: {e}")
