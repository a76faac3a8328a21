"""`nezha demo`: the original Nezha experiment on one machine.

A local origin plays www.cs.toronto.edu, throttled like the real one was
(3.49 MB/s in 2018); a cache node runs as its own process on a temporary
folder; the same dataset is downloaded through the cache twice, addressed
the way a pod with hostAliases addresses it (its Host header names the
dataset host, its connection goes to the cache). Both copies are checked
against the origin's SHA-256.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from tqdm import tqdm

from nezha.config import DemoSettings, Origin
from nezha.dev.local_cluster import LocalCluster
from nezha.dev.origin import LocalOrigin
from nezha.localproc import free_run
from nezha.logs import configure
from nezha.wire import CACHE_HEADER

HOST = "www.cs.toronto.edu"
PATH = "/~kriz/cifar-100-python.tar.gz"


@dataclass
class Download:
    seconds: float
    nbytes: int
    sha256: str
    cache: str

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


# The synthetic file is a function of its size and this seed, and carries a
# fixed modification time: a cache kept from an earlier run (--keep) holds the
# same bytes under the same validators, so its copy is a correct hit. A new
# random file at the same URL each run was not: the kept copy, fresh by the
# Last-Modified heuristic, was served for a file that had changed.
SEED = 2018
MTIME = 1_523_145_600  # 2018-04-08, when the experiment was run
KEPT = "demo.json"  # in a --keep folder: the dataset its cache holds


def make_dataset(path: Path, size: int, *, seed: int = SEED) -> str:
    """Write `size` pseudo-random bytes (incompressible, like a .tar.gz), the same for the
    same size and seed, and return their SHA-256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    block = 4 * 1024 * 1024
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            data = rng.randbytes(min(block, left))
            f.write(data)
            digest.update(data)
            left -= len(data)
    os.utime(path, (MTIME, MTIME))
    return digest.hexdigest()


def check_keep(keep: Path, size: int) -> None:
    """A --keep folder must be a folder, and hold the demo of this size if any: its copy
    would be served, fresh, in place of a file of another size."""
    from nezha.errors import ConfigError

    if keep.exists() and not keep.is_dir():
        raise ConfigError(f"--keep {str(keep)!r}: exists and is not a folder")
    try:
        held = json.loads((keep / KEPT).read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise ConfigError(f"--keep {str(keep)!r}: cannot read {KEPT} in it: {e}") from e
    if held.get("bytes") != size or held.get("seed") != SEED:
        raise ConfigError(f"--keep {str(keep)!r}: holds the demo's file of {held.get('bytes')} bytes, whose "
                          f"cached copy would be served for this one of {size}: pass --size {held.get('bytes')} "
                          f"or another folder")


async def wait_settled(url: str, timeout: float = 60.0) -> None:
    """Wait until the node has committed its fills, so the next read is a hit."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            async with s.get(url + "/readyz") as r:
                if (await r.json()).get("fills_in_flight") == 0:
                    return
            await asyncio.sleep(0.05)


async def download(cache_url: str, *, label: str, show: bool) -> Download:
    digest = hashlib.sha256()
    n = 0
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as s:
        async with s.get(cache_url + PATH, headers={"Host": HOST}) as r:
            if r.status != 200:
                raise RuntimeError(f"{label} download: cache answered {r.status}: {(await r.text())[:200]}")
            total = r.content_length
            with tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=not show,
                      file=sys.stderr, leave=True) as bar:
                async for chunk in r.content.iter_chunked(1 << 20):
                    digest.update(chunk)
                    n += len(chunk)
                    bar.update(len(chunk))
            cache = r.headers.get(CACHE_HEADER, "?")
    return Download(time.perf_counter() - started, n, digest.hexdigest(), cache)


async def run(*, size: int, rate: float, as_json: bool, keep: Path | None, nodes: int = 1) -> dict:
    work = Path(tempfile.mkdtemp(prefix="nezha-demo-"))
    data_dir = keep or work / "cache"
    origin = LocalOrigin(work / "origin", rate=rate)
    show = not as_json
    cluster = None
    try:
        if show:
            print(f"making a {size:,}-byte {PATH.rsplit('/', 1)[1]} for the local origin ...", file=sys.stderr)
        expected = await asyncio.get_running_loop().run_in_executor(
            None, make_dataset, work / "origin" / PATH.lstrip("/"), size)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / KEPT).write_text(json.dumps({"bytes": size, "seed": SEED, "sha256": expected}) + "\n")
        origin_url = await origin.start()
        cluster = LocalCluster(nodes=nodes, origins=[Origin(host=HOST, upstream=origin_url)], data_dir=data_dir,
                               base_port=free_run(nodes))
        await cluster.start()
        urls = [n.url for n in cluster.nodes.values()]
        if show:
            print(f"origin {origin_url} throttled to {rate / 1e6:.2f} MB/s plays http://{HOST}; "
                  f"cache nodes at {', '.join(urls)}", file=sys.stderr)
        # Enter through a node that does not own the object, then through
        # another one: with several nodes the warm copy is a peer hit.
        key = f"http://{HOST}{PATH}"
        owner = cluster.index.membership.ring().owners(key, 1)[0]
        entries = [n.url for n in cluster.nodes.values() if n.id != owner] or urls
        cold_url, warm_url = entries[0], entries[-1]
        cold = await download(cold_url, label=f"cold via {cold_url}", show=show)
        for url in urls:
            await wait_settled(url)
        warm = await download(warm_url, label=f"warm via {warm_url}", show=show)
        await asyncio.sleep(1.2)  # one stats flush interval
        stats = await cluster.index.read_stats()
        return {
            "url": f"http://{HOST}{PATH}",
            "bytes": size,
            "nodes": nodes,
            "owner": owner,
            "origin_rate_mb_per_s": round(rate / 1e6, 3),
            "cold_mb_per_s": round(cold.mbps, 2),
            "warm_mb_per_s": round(warm.mbps, 2),
            "speedup": round(warm.mbps / cold.mbps, 1),
            "cold_cache": cold.cache,
            "warm_cache": warm.cache,
            "origin_gets": origin.gets,
            "sha256": expected,
            "sha256_match": cold.sha256 == expected and warm.sha256 == expected,
            "stats": {"cluster": stats["cluster"], "nodes": stats["nodes"]},
        }
    finally:
        if cluster is not None:
            await cluster.stop()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


def main(settings: DemoSettings, *, as_json: bool) -> int:
    """Run the demo with checked settings; print its result as text or one JSON object."""
    size, rate, keep, nodes = settings.size, settings.rate, settings.keep, settings.nodes
    if keep is not None:
        check_keep(keep, size)
    configure(level=settings.quiet_log_level(), stream=sys.stderr)
    result = asyncio.run(run(size=size, rate=rate, as_json=as_json, keep=keep, nodes=nodes))
    if as_json:
        print(json.dumps(result))
    else:
        if result["origin_gets"] == 0:
            print(f"the kept cache in {keep} already held the file: both downloads came from it")
        print(f"cold (origin -> cache -> you): {result['cold_mb_per_s']:8.2f} MB/s  [{result['cold_cache']}]")
        print(f"warm (cache disk -> you):     {result['warm_mb_per_s']:8.2f} MB/s  [{result['warm_cache']}]")
        print(f"speed-up: {result['speedup']}x   origin GETs: {result['origin_gets']}   "
              f"sha256 {'matches' if result['sha256_match'] else 'DOES NOT MATCH'} ({result['sha256'][:16]}... "
              f"of the synthetic file the local origin served, both copies)")
        print("stats from the index (redis):")
        print(f"  {'node':<10} {'hits':>6} {'misses':>7} {'peer_hits':>10} {'from origin':>14} {'served':>14}")
        for name, st in sorted(result["stats"]["nodes"].items()):
            print(f"  {name:<10} {st['hits']:>6} {st['misses']:>7} {st['peer_hits']:>10} "
                  f"{st['bytes_from_origin']:>14,} {st['bytes_served']:>14,}")
    return 0 if result["sha256_match"] else 1
