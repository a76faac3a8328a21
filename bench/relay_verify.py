"""What checking a relayed body's digest costs: a read entering through a
non-owner, cold (the owner fills from the origin) and warm (the owner's
hit), with no digest in the head and with each of sha256 and crc64nvme.
A warm read is spliced by the kernel whatever its digest (the owner's hit
was checked when it was filled); a cold one with a digest is read through
Python and hashed (cachenode/front/relay_body.py; cachenode/fill/streamed_digest.py), since
the owner's fill may yet be cut for a mismatch.

    python bench/relay_verify.py [--mib 128] [--runs 3] [--chunked]

Two real node processes (replicas 1) and an unthrottled local origin on
this machine; curl to /dev/null. `--chunked`: the object is stored as
16 MiB chunks over both nodes and read whole, where the node assembling
the read checks it (cachenode/chunks/whole.py) cold and warm alike. Prints a line per kind and, last,

    ratios: relay_verify_cold_sha256=<r> relay_verify_cold_crc64nvme=<r> relay_verify_warm_sha256=<r> ...

each a median over `--runs` of throughput with the digest ÷ without.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster import HOST, curl_mbps  # noqa: E402
from bench.harness import settled  # noqa: E402
from bench.throughput import DigestOrigin, large_digests  # noqa: E402
from nezha.config import Origin  # noqa: E402
from nezha.dev.local_cluster import LocalCluster  # noqa: E402
from nezha.keys import key_for, parse_target  # noqa: E402
from testkit.ports import free_run  # noqa: E402

KINDS = ("none", "crc64nvme", "sha256")


def write_random(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        block = hashlib.sha256(b"relay").digest() * (1 << 15)  # 1 MiB, not compressible by anyone here
        for i in range(size >> 20):
            chunk = bytes([i & 0xFF]) + block[1:]
            digest.update(chunk)
            f.write(chunk)
    return digest.hexdigest()


async def main(mib: int, runs: int, chunked: bool = False) -> None:
    size = mib << 20
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-relay-verify-"))
    root = work / "origin"
    root.mkdir()
    loop = asyncio.get_running_loop()
    sha = await loop.run_in_executor(None, write_random, root / "large.bin", size)
    fields = await loop.run_in_executor(None, large_digests, root / "large.bin", sha)
    origin = DigestOrigin(root, fields)
    cluster = None
    try:
        # --chunked: the object stored as 16 MiB chunks across both nodes, read
        # whole (every read is then checked by the node assembling it, chunks/whole.py).
        served = Origin(host=HOST, upstream=await origin.start(),
                        **({"chunk_threshold": 32 << 20, "chunk_size": 16 << 20} if chunked else {}))
        cluster = LocalCluster(nodes=2, origins=[served], data_dir=work / "cache", base_port=free_run(2), replicas=1)
        await cluster.start()
        urls = {n.id: n.url for n in cluster.nodes.values()}
        ring = cluster.index.membership.ring()

        def outsider(path: str) -> str:
            owner = ring.owners(key_for(parse_target(path, HOST), served), 1)[0]
            return next(u for n, u in urls.items() if n != owner)

        cold: dict[str, list[float]] = {k: [] for k in KINDS}
        warm: dict[str, list[float]] = {k: [] for k in KINDS}
        for n in range(runs):
            for kind in KINDS:
                path = f"/{kind}/large.bin?run={n}"
                cold[kind].append(await curl_mbps(outsider(path), path))
                await settled(*urls.values())
        # Warm reads once every cold one has settled (a warm read right after
        # its cold one met that fill's commit and writeback: warm runs of one
        # kind spread 3x), the kinds alternating over the objects of each run.
        for n in range(runs):
            for kind in KINDS:
                path = f"/{kind}/large.bin?run={n}"
                warm[kind].append(await curl_mbps(outsider(path), path))
        what = "whole reads of a chunked object" if chunked else "relayed reads"
        print(f"{what} of {mib} MiB through a non-owner, curl to /dev/null, median of {runs}:")
        for kind in KINDS:
            print(f"  {kind:10s} cold {statistics.median(cold[kind]):8.1f} MB/s ({cold[kind]})   "
                  f"warm {statistics.median(warm[kind]):8.1f} MB/s ({warm[kind]})")
        ratios = []
        for when, got in (("cold", cold), ("warm", warm)):
            none = statistics.median(got["none"])
            ratios += [f"{'chunked' if chunked else 'relay'}_verify_{when}_{k}={statistics.median(got[k]) / none:.3f}" for k in KINDS[1:]]
        print("ratios: " + " ".join(ratios))
    finally:
        if cluster is not None:
            await cluster.stop()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunked", action="store_true",
                        help="the object stored as chunks across the ring, read whole through a node")
    args = parser.parse_args()
    asyncio.run(main(args.mib, args.runs, args.chunked))
