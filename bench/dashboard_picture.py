"""Draw docs/img/dashboard.png: the dashboard's own queries, answered by a real Prometheus.

    python bench/dashboard_picture.py [--seconds 150] [--out docs/img/dashboard.png]

Grafana is in no package registry this project installs from, so this draws
the panels of helm/nezha/dashboards/nezha.json with matplotlib instead, from
the same PromQL, asked of a real Prometheus (Debian's `prometheus`) that
scraped a real local cluster while it worked: three `nezha cache` processes
(`nezha up`'s LocalCluster, embedded index, replicas 2, 24 MB of disk each)
in front of a local origin, and clients reading 1 MiB files with a skewed
popularity through random nodes. For the first third they read 20 files
(the cache warms up, hits rise); then 120 (more than fits: evictions of
young objects, more misses). The picture has the dashboard's "Cluster" and
"Cache nodes" rows: the controller and webhook rows need a Kubernetes API,
which this machine has none of.

Not a benchmark: it prints no ratios. Needs prometheus (apt-get install
prometheus; its promtool is what the alert tests use) and matplotlib (pip
install matplotlib). Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nezha.config import Origin  # noqa: E402
from nezha.dev.local_cluster import LocalCluster  # noqa: E402
from nezha.dev.origin import LocalOrigin  # noqa: E402
from testkit.ports import free_run  # noqa: E402
from testkit.prometheus import Prometheus  # noqa: E402

HOST = "www.cs.toronto.edu"
DASHBOARD = ROOT / "helm" / "nezha" / "dashboards" / "nezha.json"
ROWS = ("Cluster", "Cache nodes")
NAMESPACE = "local"
SCRAPE = 1.0  # seconds; Grafana's $__rate_interval would be 4 scrapes at least
RATE_INTERVAL = "10s"


async def load(urls: list[str], *, seconds: float, files: int, started: float) -> int:
    """Clients reading files with a skewed popularity, through random nodes; the working set widens after a third."""
    rng = random.Random(7)
    weights = [1 / (i + 1) ** 0.9 for i in range(files)]
    done = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() - started < seconds:
            wide = time.monotonic() - started > seconds / 3
            n = files if wide else files // 6
            i = rng.choices(range(n), weights=weights[:n])[0]
            async with session.get(f"{rng.choice(urls)}/data/{i}.bin", headers={"Host": HOST}) as r:
                await r.read()
            done += 1
            await asyncio.sleep(0.02)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(6)))
    return done


def dashboard_expr(expr: str) -> str:
    """A panel's PromQL with Grafana's variables filled in: this namespace, every node."""
    return (expr.replace("$__rate_interval", RATE_INTERVAL).replace("$namespace", NAMESPACE)
            .replace('pod=~"$node"', 'pod=~".*"'))


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def draw(panels: list[tuple[str, str, list[tuple[str, list[dict]]]]], out: Path, *, start: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 3.0), squeeze=False)
    scale = {"bytes": (1 / 2**20, "MiB"), "Bps": (1 / 2**20, "MiB/s"), "percentunit": (100, "%")}
    for ax, (title, unit, series) in zip(axes.flat, panels):
        factor, label = scale.get(unit, (1, {"reqps": "req/s", "ops": "/s", "x": "×", "s": "s"}.get(unit, "")))
        if unit == "s" and max((float(v) for _, rs in series for r in rs for _, v in r["values"]
                                if v not in ("NaN", "+Inf")), default=0) < 10:
            factor, label = 1000, "ms"
        for name, results in series:
            for result in results:
                # Series that stayed at zero (a label value exported from the start, never
                # counted here: error, stale, tls ...) would only crowd the legend.
                if all(float(v) == 0 for _, v in result["values"]) and len(results) > 1:
                    continue
                xs = [float(t) - start for t, _ in result["values"]]
                ys = [float(v) * factor for _, v in result["values"]]
                ax.plot(xs, ys, label=legend(name, result["metric"]), linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=8)
    fig.suptitle("Nezha dashboard (Cluster, Cache nodes), its own queries on a real Prometheus: 3 local nodes, "
                 "working set widened at a third of the run", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dashboard.png")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        sys.exit("prometheus is not installed: apt-get install prometheus")
    work = Path(tempfile.mkdtemp(prefix="nezha-dashboard-"))
    files = 120
    (work / "origin" / "data").mkdir(parents=True)
    for i in range(files):
        (work / "origin" / "data" / f"{i}.bin").write_bytes(os.urandom(1 << 20))
    origin = LocalOrigin(work / "origin")
    cluster = prom = None
    try:
        served = Origin(host=HOST, upstream=await origin.start())
        cluster = LocalCluster(nodes=3, origins=[served], data_dir=work / "cache", base_port=free_run(3), replicas=2,
                               node_settings={"capacity": 24 << 20})
        await cluster.start()
        nodes = sorted(cluster.nodes.values(), key=lambda n: n.id)
        prom = Prometheus(prometheus, work, scrape_interval=SCRAPE, targets=[
            (n.url.removeprefix("http://"), {"namespace": NAMESPACE, "pod": f"nezha-cache-{i}"})
            for i, n in enumerate(nodes)])
        await prom.start()
        async with aiohttp.ClientSession() as session:
            await prom.scraped(session)
            start = time.time()
            requests = await load([n.url for n in nodes], seconds=args.seconds, files=files,
                                  started=time.monotonic())
            await asyncio.sleep(3 * SCRAPE)
            end = time.time()
            dashboard = json.loads(DASHBOARD.read_text())
            panels, row = [], None
            for p in dashboard["panels"]:
                if p["type"] == "row":
                    row = p["title"]
                    continue
                if row not in ROWS:
                    continue
                series = [(t.get("legendFormat", ""),
                           await prom.query_range(session, dashboard_expr(t["expr"]), start=start, end=end))
                          for t in p["targets"]]
                panels.append((p["title"], p["fieldConfig"]["defaults"].get("unit", ""), series))
        draw(panels, args.out, start=start)
        print(f"{args.out}: {len(panels)} panels, {requests} requests in {args.seconds:g} s")
    finally:
        if prom is not None:
            prom.stop()
        if cluster is not None:
            await cluster.stop()
        await origin.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
