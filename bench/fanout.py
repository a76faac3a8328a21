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

The chunked-object half of the issue's benchmark (chunk_balance, chunked_read) is not here yet: chunking
is not built.
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
CLIENTS = 64
FORMAT = "%{http_code} %{size_download} %header{x-nezha-served-by} %header{x-nezha-cache}\\n"


def _curl(url: str) -> tuple[int, int, str, str]:
    out = subprocess.run([CURL, "-s", "-o", "/dev/null", "-H", f"Host: {HOST}", "-w", FORMAT, url + PATH],
                         capture_output=True, text=True, check=True).stdout.split()
    status, size = int(out[0]), int(out[1])
    served_by = out[2] if len(out) > 3 else ""
    return status, size, served_by, out[-1]


async def curl(url: str) -> tuple[int, int, str, str]:
    # curl runs in a thread: the origin shares this event loop and must keep serving.
    return await asyncio.get_running_loop().run_in_executor(None, _curl, url)


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
        print(f"ratios: owner_share_off={off['owner_share']:.3f} owner_share_on={on['owner_share']:.3f} "
              f"hot_speedup={on['rate'] / off['rate']:.3f} origin_gets_off={off['origin_gets']} "
              f"origin_gets_on={on['origin_gets']}")
    finally:
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 16 MiB object instead of 64 MiB")
    a = parser.parse_args()
    try:
        asyncio.run(main(a.quick))
    except BenchError as e:
        sys.exit(f"fanout: {e}")
