#!/usr/bin/env python3
"""HTTPS through one cache node, measured against its own plain HTTP and against nginx.

One run on this machine measures, with a node given the Nezha CA (`nezha ca
init --local`) and a TLS port:

- warm throughput of one large object (1 GiB; 256 MiB with --quick), MB/s,
  median of several curl runs to /dev/null: through the node's plain port
  (sendfile), through its TLS port (terminated with the leaf it minted for
  the name, curl trusting only the Nezha CA), and from nginx serving the
  same file over HTTPS with a static certificate for the same name from the
  same CA (Debian's nginx with as many workers as the node, `--workers`,
  default 1; sendfile on, access log off). Runs alternate so drift hits all
  three;
- full TLS handshakes per second with SNI and no session reuse (the leaf is
  a memory hit after the first), by a load of `--clients` Python client
  processes, for 5 s (2 s with --quick), against the node and against nginx.
  The clients share the machine's two cores with the server, so the number
  is this machine's, not the server's ceiling; the same clients drive both.

The last line is machine-readable:

    ratios: tls_warm=<node https / node http> tls_vs_nginx=<node https / nginx https> handshakes_per_s=<node>

Everything listens on 127.0.0.1 (the name is given to curl with --resolve).
Needs curl and nginx (installed with apt-get when run as root).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ssl
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from bench.harness import (CURL, NGINX, BenchError, Children, MiB, Nginx, Node, StaticFiles, ensure_tool,  # noqa: E402
                           nginx_conf, nginx_version, settled, source_version, write_random)
from nezha.dev.origin import LocalOrigin  # noqa: E402
from nezha.pki import Pair, make_serving  # noqa: E402
from testkit.ports import free_port  # noqa: E402

NAME = "bench.nezha.test"
RELAY_NAME = "relay.nezha.test"  # an origin marked tls: passthrough, whose real host is the nginx below


HANDSHAKER = r"""
import socket, ssl, sys, time
host, port, name, cafile, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
ctx = ssl.create_default_context(cafile=cafile)
done = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    with socket.create_connection((host, port)) as raw:
        with ctx.wrap_socket(raw, server_hostname=name):  # a full handshake: no session offered
            done += 1
print(done)
"""


class Run:
    def __init__(self, children: Children, work: Path, *, size: int, repeats: int, seconds: float,
                 clients: int) -> None:
        self.children, self.work = children, work
        self.size, self.repeats, self.seconds, self.clients = size, repeats, seconds, clients

    async def curl_mbps(self, url: str, *, tls: bool, port: int, name: str = NAME) -> float:
        argv = [CURL, "-s", "-S", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}"]
        if tls:
            argv += ["--cacert", str(self.work / "ca" / "ca.crt"), "--resolve", f"{name}:{port}:127.0.0.1"]
        else:
            argv += ["-H", f"Host: {NAME}"]
        out = await self.children.run(*argv, url, timeout=900)
        code, size, secs = out.split()
        if code != "200" or int(size) != self.size:
            raise BenchError(f"GET {url} answered {code} with {size} bytes, expected 200 with {self.size}")
        return int(size) / float(secs) / 1e6

    async def handshakes(self, port: int) -> float:
        script = self.work / "handshaker.py"
        script.write_text(HANDSHAKER)
        procs = [await self.children.spawn(sys.executable, str(script), "127.0.0.1", str(port), NAME,
                                           str(self.work / "ca" / "ca.crt"), str(self.seconds),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(self.clients)]
        total = 0
        for proc in procs:
            out, err = await asyncio.wait_for(proc.communicate(), self.seconds + 60)
            if proc.returncode != 0:
                raise BenchError(f"handshake client failed: {err.decode(errors='replace')[-500:]}")
            total += int(out)
            await self.children.stop(proc)
        return total / self.seconds


async def start_node(children: Children, work: Path, origin_url: str, nginx_port: int,
                     workers: int = 1) -> tuple[Node, int]:
    """The node with a TLS port and the Nezha CA; RELAY_NAME is passed through to nginx untouched."""
    tls_port = free_port()
    config = work / "node.yaml"
    config.write_text(yaml.safe_dump({"origins": [
        {"host": NAME, "upstream": origin_url, "tls_upstream": origin_url},
        {"host": RELAY_NAME, "upstream": origin_url, "tls": "passthrough",
         "tls_upstream": f"https://127.0.0.1:{nginx_port}"}]}))
    node = Node(children, work)
    await node.start(args=["--tls-listen", f"127.0.0.1:{tls_port}", "--ca-cert", str(work / "ca" / "ca.crt"),
                           "--ca-key", str(work / "ca" / "ca.key"), "--config", str(config),
                           "--workers", str(workers)])
    await node.serving_workers(workers)
    return node, tls_port


async def start_nginx(children: Children, work: Path, root: Path, ca: Pair, workers: int = 1) -> int:
    nginx = Nginx(children, work)
    leaf = make_serving(ca, names=[NAME, RELAY_NAME], now=dt.datetime.now(dt.timezone.utc), days=7)
    (nginx.prefix / "cert.pem").write_bytes(leaf.cert_pem)
    (nginx.prefix / "key.pem").write_bytes(leaf.key_pem)
    # The same file over HTTPS, a static certificate for the same name.
    await nginx.start(nginx_conf(StaticFiles(root=root, name=NAME, cert=nginx.prefix / "cert.pem",
                                             key=nginx.prefix / "key.pem"), by="bench/tls.py", workers=workers))
    return nginx.port


async def run(args: argparse.Namespace, work: Path, children: Children) -> str:
    size = (256 if args.quick else 1024) * MiB
    run_ = Run(children, work, size=size, repeats=3 if args.quick else 5, seconds=2.0 if args.quick else 5.0,
               clients=args.clients)
    ensure_tool(CURL, "curl")
    ensure_tool(NGINX, "nginx")
    print(f"# {source_version()}, {nginx_version()}, {ssl.OPENSSL_VERSION}; node --workers {args.workers}, "
          f"nginx worker_processes {args.workers}", flush=True)
    await children.run(sys.executable, "-m", "nezha", "ca", "init", "--local", str(work / "ca"), timeout=60)
    ca = Pair.load((work / "ca" / "ca.crt").read_bytes(), (work / "ca" / "ca.key").read_bytes())
    root = work / "origin"
    write_random(root / "large.bin", size)
    origin = LocalOrigin(root)
    origin_url = await origin.start()
    try:
        nginx_port = await start_nginx(children, work, root, ca, args.workers)
        node, tls_port = await start_node(children, work, origin_url, nginx_port, args.workers)
        port = node.port
        http_url = f"http://127.0.0.1:{port}/large.bin"
        https_url = f"https://{NAME}:{tls_port}/large.bin"
        nginx_url = f"https://{NAME}:{nginx_port}/large.bin"
        # Warm both of the node's keys (http:// and https:// are distinct objects).
        await run_.curl_mbps(http_url, tls=False, port=port)
        await run_.curl_mbps(https_url, tls=True, port=tls_port)
        await run_.curl_mbps(nginx_url, tls=True, port=nginx_port)
        await settled(node.url)
        warmed = origin.gets  # (a cold fill of a large object is many range requests)
        relay_url = f"https://{RELAY_NAME}:{tls_port}/large.bin"
        direct_url = f"https://{RELAY_NAME}:{nginx_port}/large.bin"
        http, https, ngx, relayed, direct = [], [], [], [], []
        for _ in range(run_.repeats):
            http.append(await run_.curl_mbps(http_url, tls=False, port=port))
            https.append(await run_.curl_mbps(https_url, tls=True, port=tls_port))
            ngx.append(await run_.curl_mbps(nginx_url, tls=True, port=nginx_port))
            relayed.append(await run_.curl_mbps(relay_url, tls=True, port=tls_port, name=RELAY_NAME))
            direct.append(await run_.curl_mbps(direct_url, tls=True, port=nginx_port, name=RELAY_NAME))
        if origin.gets != warmed:
            raise BenchError(f"warm runs reached the origin ({origin.gets - warmed} requests)")
        node_hs = await run_.handshakes(tls_port)
        nginx_hs = await run_.handshakes(nginx_port)
    finally:
        await origin.stop()
    m_http, m_https, m_ngx = (statistics.median(x) for x in (http, https, ngx))
    print(f"warm {size // MiB} MiB, MB/s (median of {run_.repeats}): node http {m_http:.0f} "
          f"({min(http):.0f}-{max(http):.0f}), node https {m_https:.0f} ({min(https):.0f}-{max(https):.0f}), "
          f"nginx https {m_ngx:.0f} ({min(ngx):.0f}-{max(ngx):.0f})")
    m_relay, m_direct = statistics.median(relayed), statistics.median(direct)
    print(f"passed through (tls: passthrough, splice) to nginx https, MB/s: {m_relay:.0f} "
          f"({min(relayed):.0f}-{max(relayed):.0f}) against {m_direct:.0f} direct: relay={m_relay / m_direct:.3f}")
    print(f"full handshakes/s with SNI, {args.clients} client processes for {run_.seconds:g} s: "
          f"node {node_hs:.0f}, nginx {nginx_hs:.0f}")
    return (f"ratios: tls_warm={m_https / m_http:.3f} tls_vs_nginx={m_https / m_ngx:.3f} "
            f"handshakes_per_s={node_hs:.0f}")


async def main_async(args: argparse.Namespace) -> int:
    children = Children()
    with tempfile.TemporaryDirectory(prefix="nezha-bench-tls-") as tmp:
        try:
            line = await run(args, Path(tmp), children)
        except BenchError as e:
            print(f"bench/tls.py: {e}", file=sys.stderr)
            return 1
        finally:
            await children.stop_all()
    print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB, 3 runs, 2 s of handshakes")
    parser.add_argument("--clients", type=int, default=2, help="handshake client processes (default 2)")
    parser.add_argument("--workers", type=int, default=1, help="the node's --workers and nginx's worker_processes "
                        "(default 1)")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
