"""Stampede benchmark (issue 38): K = 4·N clients read one cold object at the same moment through N cache nodes,
each node behind a network link of its own, as a curve in N against the ideal.

    sudo python bench/stampede.py [--quick] [--size MIB] [--rate MBPS] [--origin-rate MBPS] [--trace]

Needs root (network namespaces, tc), iproute2, redis-server, and matplotlib for the plot (pip install
matplotlib). Each run is testkit/stampede.py's scene: every cache node, the origin, Redis and each client group
in a namespace of its own joined through a bridge, each node's link a token bucket at B bytes/s each way (burst
64 KiB, latency 50 ms), the origin's at O; real `nezha cache` processes and a real redis-server. Everything the
benchmark made is deleted on exit, Ctrl-C and failure. Configurations side by side in one run:

    direct          the clients read from the origin (no cache)
    plain           Nezha, hot copies and chunks off (--hot-reads 0, chunk_threshold 0)
    shipped         Nezha as shipped, the object below the chunk threshold (whole: streaming copies, hot copies on)
    shipped-chunks  Nezha as shipped, the object above the chunk threshold (chunk_threshold S, chunk_size max(1 MiB, S/8))
    killed          `shipped` at the middle N, the key's first owner (the one filling it) SIGKILLed when the origin
                    has sent half the object
    killed-chunks   the same for `shipped-chunks`: the key's first owner fills some chunks and holds the manifest

For each it prints per N: p50 p95 p99 max of the clients' time to last byte, the ideal (the larger of S / O,
one origin fetch, and K·S / (N·B), every node link busy), origin bytes, the first byte's path (the
X-Nezha-Cache labels clients saw), docs/capacity.md's model for the configuration (`model`, see `model()`)
and the busiest link's fastest second against its cap; then the clients per node (`groups`, from --spread), the
first byte's time (p50, p95), the bytes each node's link sent and received in S (`links_S tx=[node0,..]
rx=[node0,..]`) and the most seconds any capped link ran above 1.05 x its cap (0.5 s windows;
testkit/links.py). Its last line:

    ratios: stampede_p95_vs_ideal=<worst N, shipped> stampede_flatness=<p95 at largest N / p95 at N=2,
            shipped> stampede_origin=<origin bytes / S, shipped> stampede_killed_origin=<killed run>
            (and the same three for each configuration, suffixed _<config>)

Each headline ratio is the worse of `shipped`'s and `shipped-chunks`'s (both are Nezha as shipped), and
stampede_killed_origin the worse of the killed runs'.

Targets (issue 38): p95_vs_ideal <= 1.5, flatness <= 1.3, origin <= 1.02, killed origin <= 1.1.
The plot, docs/img/stampede.png, is drawn here: p95 per configuration against the ideal, over N.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import REPO, BenchError, source_version  # noqa: E402
from cachenode.chunks.feeders import fanout_for as chunk_fanout_for  # noqa: E402
from cachenode.chunks.feeders import star as chunk_star  # noqa: E402
from cachenode.cluster.streaming import fanout_for  # noqa: E402
from nezha.chunks import Layout, place  # noqa: E402
from testkit import links  # noqa: E402
from testkit.netns import NetnsUnavailable, check_available  # noqa: E402
from testkit.stampede import Outcome, Scene, run  # noqa: E402

MiB = 1 << 20
CONFIGS = ("direct", "plain", "shipped", "shipped-chunks")
KILLED = ("killed", "killed-chunks")
PLOT = REPO / "docs" / "img" / "stampede.png"


def scene(config: str, n: int, *, size: int, rate: int, origin_rate: int, kill_at: float | None = None,
          log_level: str = "warning", spread: str = "even", seed: int = 0) -> Scene:
    chunked = config in ("shipped-chunks", "killed-chunks")
    return Scene(config="shipped" if config.startswith(("shipped", "killed")) else config, nodes=n, clients=4 * n,
                 size=size, node_rate=rate, origin_rate=origin_rate, kill_at=kill_at,
                 chunk_threshold=size if chunked else None, chunk_size=max(MiB, size // 8) if chunked else None,
                 log_level=log_level, spread=spread, seed=seed)


def model(config: str, sc: Scene) -> float:
    """docs/capacity.md's prediction of the time to last byte, for this configuration's scene (a lower bound:
    the busiest link, or the origin, moving its bytes at its rate; one synchronized cold wave).

    direct: the origin's link carries every client's S. plain (hot copies and chunks off): the key's first
    owner fills it and every other node relays each of its pods' reads from it (the second owner holds no
    replica yet), so all K·S leave the first owner's link. shipped (whole, below the chunk threshold): each
    node's pods share one stream, kept as its copy as it arrives (cluster/streaming_copies.py), and the
    copies feed each other in a tree under the first owner (cluster/streaming.py `feeds_from`), of degree
    F = `fanout_for(N)`: 1 (a chain) up to 16 nodes, else 2: the busiest link sends its own pods' K/N reads
    and at most F copies, (K/N + min(F, N − 1))·S. chunks: each node passes each chunk it does not own on to
    its pods once however many read there (chunks/fills.py `passing`). Where the first owners' leads are even
    within a slack (chunks/feeders.py `star`: at every N of this benchmark), each owner sends its chunks to
    every other node itself: the busiest link sends its pods' K/N reads and its leads N − 1 times,
    f·(N − 1)·S, f the largest share of chunks one node owns first (`first_owner_share`, printed as `f`).
    Elsewhere the nodes asking a chunk's owner while it sends it read it from each other in a chain of the
    same degree F, so a link sends each chunk at most F times: (K/N + min(F, f·(N − 1)))·S."""
    K, S, N, B, O = sc.clients, sc.size, sc.nodes, sc.node_rate, sc.origin_rate
    if config == "direct":
        return K * S / O
    if config == "plain":
        return max(S / O, K * S / B)
    if sc.chunk_threshold is None:
        return max(S / O, (K / N + min(fanout_for(N), N - 1)) * S / B)
    f, chunks = first_owner_share(sc), Layout(size=S, chunk_size=sc.chunk_size or S).count
    passes = f * (N - 1) if chunk_star(chunks, N) else min(chunk_fanout_for(N), f * (N - 1))
    return max(S / O, (K / N + passes) * S / B)


def first_owner_share(sc: Scene) -> float:
    """f: the largest share of the object's chunks whose first owner is one node, on the scene's ring."""
    from nezha.ring import Ring
    from testkit.stampede import HOST, PATH

    ring = Ring({f"node{i}": 1 for i in range(sc.nodes)})
    table = place(ring, f"http://{HOST}{PATH}", Layout(size=sc.size, chunk_size=sc.chunk_size or sc.size),
                  min(sc.replicas, sc.nodes))
    return max(Counter(owners[0] for owners in table).values()) / len(table)


def line(config: str, o: Outcome) -> str:
    s = o.summary()
    labels = Counter(c["label"] for c in o.clients)
    caps = {h: (o.scene.origin_rate if h == "origin" else o.scene.node_rate) for h in o.link_peak
            if h == "origin" or h.startswith("node")}
    busiest = max(caps, key=lambda h: o.link_peak[h] / caps[h]) if caps else None
    link = (f"busiest link {busiest} {o.link_peak[busiest] / 1e6:.1f} MB/s of {caps[busiest] / 1e6:.1f}"
            if busiest else "no link samples")
    return (f"{config:15s} N={o.scene.nodes:2d} K={o.scene.clients:2d}  p50 {s['p50']:6.2f}  p95 {s['p95']:6.2f}  "
            f"p99 {s['p99']:6.2f}  max {s['max']:6.2f}  ideal {s['ideal']:5.2f}  model {model(config, o.scene):5.2f}  "
            f"{_share(o.scene)}origin_bytes {o.origin_bytes} "
            f"({o.origin_bytes / o.scene.size:.3f} S, {len(o.origin_requests)} requests)  exact {o.exact}/"
            f"{len(o.clients)}  first byte: {dict(labels)}  {link}{_first_link(o)}  node CPU {sum(o.node_cpu.values()):.1f} s, "
            f"clients' {sum({c['group']: c.get('group_cpu', 0.0) for c in o.clients}.values()):.1f} s"
            f"{_measured(o)}")


def _measured(o: Outcome) -> str:
    """The columns after the first ones: clients per node (the spread), the first byte's time (p50, p95), what
    each node's link sent and received in S (node0, node1, ...), and the seconds each capped link ran above
    links.ABOVE_FACTOR × its cap (the most of any link, and which)."""
    nodes = [f"node{i}" for i in range(o.scene.nodes)]
    tx = ",".join(f"{o.link_bytes[h][0] / o.scene.size:.2f}" if h in o.link_bytes else "?" for h in nodes)
    rx = ",".join(f"{o.link_bytes[h][1] / o.scene.size:.2f}" if h in o.link_bytes else "?" for h in nodes)
    worst = max(o.link_above, key=lambda h: o.link_above[h]) if o.link_above else None
    rule = f">{links.ABOVE_FACTOR:g}x cap over {links.ABOVE_WINDOW:g} s windows"
    above = ("above_cap_s ?" if worst is None else f"above_cap_s 0.0 (no link; {rule})" if not o.link_above[worst]
             else f"above_cap_s {o.link_above[worst]:.1f} ({worst}; {rule})")
    return (f"  groups {o.scene.groups}  first_byte p50 {o.percentile(50, 'first'):.2f} p95 "
            f"{o.percentile(95, 'first'):.2f}  links_S tx=[{tx}] rx=[{rx}]  {above}")


def _share(sc: Scene) -> str:
    """f, the largest share of the chunks one node owns first, for a chunked scene: what the first owners'
    links carried before the chunk chains (`model`)."""
    return f"f {first_owner_share(sc):.3f}  " if sc.chunk_threshold is not None else ""


def _first_link(o: Outcome) -> str:
    """What the key's first owner's link sent during the run, in S: its pods' reads, the copies or relays it
    fed, and the answers closed unread."""
    sent = o.link_bytes.get(o.owner or "", (0, 0))[0]
    return f"  {o.owner} sent {sent / o.scene.size:.2f} S" if sent else ""


def trace(o: Outcome, *, step: float = 0.5) -> str:
    """Where a run's time went (`--trace`): what each node's link (and the origin's) sent in each `step`
    seconds, in MB/s, from the release on; each client group's first and last byte; and, from the nodes' logs
    at info, which node sent each chunk to which (a chunk's fill or pass names its source: one line per
    sender, its total beside it; N − 1 sends per chunk in all, (N − 1)/N of them per node when they even out)
    and when each of those sends started and ended (`hop_lines`)."""
    hosts = sorted((h for h in (o.link_series[0][1] if o.link_series else {}) if h.startswith("node")),
                   key=lambda h: int(h[4:])) + ["origin"]
    out = ["    t    " + " ".join(f"{h:>7s}" for h in hosts) + "   (MB/s sent)"]
    series, at = o.link_series, 0
    while at + 1 < len(series):
        end = next((j for j in range(at + 1, len(series)) if series[j][0] - series[at][0] >= step), None)
        if end is None:
            break
        (t0, c0), (t1, c1) = series[at], series[end]
        out.append(f"  {t0:5.1f}  " + " ".join(f"{(c1[h][0] - c0[h][0]) / (t1 - t0) / 1e6:7.1f}" for h in hosts))
        at = end
    groups: dict[int, list[dict]] = {}
    for c in o.clients:
        groups.setdefault(c["group"], []).append(c)
    out.append("  clients, first and last byte by group: " + "  ".join(
        f"{g}: {min(c['first'] or 0 for c in cs):.2f}-{max(c['first'] or 0 for c in cs):.2f} / "
        f"{min(c['last'] for c in cs):.2f}-{max(c['last'] for c in cs):.2f}" for g, cs in sorted(groups.items())))
    sends = chunk_sends(o.work) if o.work is not None else {}
    for source, chunks in sorted(sends.items()):
        out.append(f"  {source:7s} sent {sum(len(v) for v in chunks.values()):2d} chunks: " + "  ".join(
            f"{i}->{','.join(to)}" for i, to in sorted(chunks.items())))
    if o.work is not None:
        out.extend(hop_lines(o.work))
    return "\n".join(out)


def chunk_hops(work: Path) -> list[tuple[int, str, str, float, float]]:
    """From the nodes' logs (at info), each chunk's fill or pass: (chunk index, node, its source: a node or
    "origin", start, end), in seconds from the first one's start (the logs' clocks, not the release's)."""
    import datetime
    import json

    hops = []
    for f in sorted(work.glob("node*.log")):
        for raw in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if e.get("event") in ("chunk_filled", "chunk_passed") and "#chunk/" in e.get("key", ""):
                end = datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
                hops.append((int(e["key"].rsplit("/", 1)[1]), f.stem, e["source"], end - e["seconds"], end))
    first = min((h[3] for h in hops), default=0.0)
    return [(i, node, source, start - first, end - first) for i, node, source, start, end in hops]


def chunk_sends(work: Path) -> dict[str, dict[int, list[str]]]:
    """From the nodes' logs (at info): source node (or "origin") -> chunk index -> the nodes it sent it to."""
    sends: dict[str, dict[int, list[str]]] = {}
    for index, node, source, _, _ in chunk_hops(work):
        sends.setdefault(source, {}).setdefault(index, []).append(node)
    return sends


def hop_lines(work: Path) -> list[str]:
    """Each chunk's fills and passes in the order they ended: node<-source start-end (seconds), so a hop
    that crawled (a new stream beside a link's long ones) and the nodes waiting behind it show."""
    by_chunk: dict[int, list[tuple[int, str, str, float, float]]] = {}
    for hop in chunk_hops(work):
        by_chunk.setdefault(hop[0], []).append(hop)
    return [f"  chunk {i}: " + "  ".join(f"{node}<-{source} {start:.2f}-{end:.2f}"
                                         for _, node, source, start, end in sorted(hops, key=lambda h: h[4]))
            for i, hops in sorted(by_chunk.items())]


def plot(results: dict[str, dict[int, Outcome]], ns: list[int], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("matplotlib is missing: pip install matplotlib (the plot is drawn by this benchmark)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    any_run = next(iter(results.values()))
    ideal = [any_run[n].scene.ideal for n in ns]
    ax.plot(ns, ideal, "k--", label="ideal: max(S/O, K·S/(N·B))")
    ax.plot(ns, [1.5 * i for i in ideal], ":", color="grey", label="1.5 × ideal (target)")
    for config, runs in results.items():
        have = [n for n in ns if n in runs]
        drawn = ax.plot(have, [runs[n].percentile(95) for n in have], "o-", label=f"{config}: p95")
        ax.plot(have, [model(config, runs[n].scene) for n in have], ":", color=drawn[0].get_color(), linewidth=1,
                label=f"{config}: model")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("cache nodes N (K = 4·N clients)")
    ax.set_ylabel("time to last byte, s")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def ratios(runs: dict[int, Outcome], ns: list[int]) -> tuple[float, float, float]:
    worst = max(runs[n].percentile(95) / runs[n].scene.ideal for n in ns)
    flat = runs[ns[-1]].percentile(95) / runs[ns[0]].percentile(95)
    origin = max(runs[n].origin_bytes / runs[n].scene.size for n in ns)
    return worst, flat, origin


def main(args: argparse.Namespace) -> None:
    try:
        check_available()
    except NetnsUnavailable as e:
        raise BenchError(str(e)) from None
    if shutil.which("redis-server") is None:
        raise BenchError("redis-server is missing: apt-get install -y redis-server")
    if importlib.util.find_spec("matplotlib") is None:  # said now, not after minutes of runs
        raise BenchError("matplotlib is missing: pip install matplotlib (the plot is drawn by this benchmark)")
    ns = args.nodes or ([2, 4, 8] if args.quick else [2, 4, 8, 16])
    size, rate, origin_rate = args.size * MiB, int(args.rate * 1e6), int(args.origin_rate * 1e6)
    work = Path(tempfile.mkdtemp(prefix="nezha-bench-stampede-"))
    print(f"stampede: S = {args.size} MiB, B = {rate / 1e6:g} MB/s per node link each way, O = "
          f"{origin_rate / 1e6:g} MB/s, tbf burst 64 KiB latency 50 ms; clients spread {args.spread}"
          f"{f' (seed {args.seed})' if args.spread == 'random' else ''}; {source_version()}", flush=True)
    chosen = args.configs or list(CONFIGS + KILLED)
    results: dict[str, dict[int, Outcome]] = {c: {} for c in CONFIGS if c in chosen}
    killed: dict[str, Outcome] = {}
    try:
        for n in ns:
            for config in results:
                started = time.monotonic()
                o = run(scene(config, n, size=size, rate=rate, origin_rate=origin_rate, log_level=args.log_level,
                              spread=args.spread, seed=args.seed), work / f"{config}-{n}")
                _keep(o, args.keep_logs, f"{config}-{n}")
                results[config][n] = o
                print(line(config, o) + f"  ({time.monotonic() - started:.0f} s)", flush=True)
                if args.trace:
                    print(trace(o), flush=True)
                if o.exact != len(o.clients):
                    raise BenchError(f"{config} N={n}: {len(o.clients) - o.exact} clients got wrong bytes")
        middle = ns[len(ns) // 2]
        for config in (c for c in KILLED if c in chosen):
            killed[config] = k = run(scene(config, middle, size=size, rate=rate, origin_rate=origin_rate, kill_at=0.5,
                                           log_level=args.log_level, spread=args.spread, seed=args.seed),
                                     work / config)
            _keep(k, args.keep_logs, config)
            print(line(config, k) + f"  (killed {k.killed} mid-fill; {k.cut} clients reading through it were cut, "
                  f"{k.exact} exact; origin requests (by, range, bytes sent): "
                  f"{[(e['by'], e['range'], e['sent']) for e in k.origin_log]})", flush=True)
            if k.exact + k.cut != len(k.clients):
                raise BenchError(f"{config}: {len(k.clients) - k.exact - k.cut} clients not reading through the "
                                 "killed node got wrong bytes")
        ratios_line = "ratios: " + summary(results, killed, ns, size=size)
        if results:
            plot(results, ns, args.plot, f"{args.size} MiB object, B = {rate / 1e6:g} MB/s per node, "
                 f"O = {origin_rate / 1e6:g} MB/s")
            print(f"plot: {args.plot}", flush=True)
        print(ratios_line)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summary(results: dict[str, dict[int, Outcome]], killed: dict[str, Outcome], ns: list[int], *, size: int) -> str:
    """The ratios line: each of the three the worse of the two shipped configurations' (an object below the
    chunk threshold and one above it are both Nezha as shipped), the worse killed run's origin bytes, then
    each configuration's own (for those run)."""
    parts = []
    shipped = [ratios(results[c], ns) for c in ("shipped", "shipped-chunks") if c in results]
    if shipped:
        worst, flat, origin = (max(r[i] for r in shipped) for i in range(3))
        parts.append(f"stampede_p95_vs_ideal={worst:.3f} stampede_flatness={flat:.3f} stampede_origin={origin:.3f}")
    if killed:
        parts.append(f"stampede_killed_origin={max(k.origin_bytes for k in killed.values()) / size:.3f}")
        parts += [f"stampede_killed_origin_{'whole' if c == 'killed' else 'chunks'}={k.origin_bytes / size:.3f}"
                  for c, k in killed.items()]
    for config, runs in results.items():
        worst, flat, origin = ratios(runs, ns)
        parts.append(f"stampede_p95_vs_ideal_{config}={worst:.3f} stampede_flatness_{config}={flat:.3f} "
                     f"stampede_origin_{config}={origin:.3f}")
    return " ".join(parts)


def _keep(o: Outcome, where: Path | None, name: str) -> None:
    """The run's node logs copied to `where`/`name` (they are deleted with the run's folder otherwise)."""
    if where is None or o.work is None:
        return
    (where / name).mkdir(parents=True, exist_ok=True)
    for f in o.work.glob("node*.log"):
        shutil.copy(f, where / name / f.name)


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds every `with Network`, which deletes what it made


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2, 4, 8 (else 2, 4, 8, 16)")
    parser.add_argument("--nodes", type=int, nargs="+", help="the N to run, instead (e.g. --nodes 16 at a lower "
                        "--rate: on two cores 16 nodes and their clients are CPU-bound at 10 MB/s)")
    parser.add_argument("--size", type=int, default=8, help="object size S in MiB (default 8)")
    parser.add_argument("--rate", type=float, default=10.0, help="B: each node link's rate in MB/s (default 10)")
    parser.add_argument("--origin-rate", type=float, default=10.0, help="O: the origin link's rate in MB/s "
                        "(default 10)")
    parser.add_argument("--plot", type=Path, default=PLOT, help=f"where to draw the plot (default {PLOT})")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS + KILLED, help="run only these configurations "
                        "(default: all; the killed ones at the middle N)")
    parser.add_argument("--log-level", default="warning", help="the nodes' log level (default warning)")
    parser.add_argument("--spread", choices=("even", "random"), default="even", help="how clients pick a node: "
                        "even (round-robin, K/N each: what the ideal assumes; default) or random (each client's "
                        "connection to a node picked at random, as kube-proxy's iptables mode picks a Service's "
                        "endpoint)")
    parser.add_argument("--seed", type=int, default=0, help="--spread random: the choices' seed (default 0; "
                        "printed, so a run can be repeated)")
    parser.add_argument("--keep-logs", type=Path, help="copy each run's node logs under this folder")
    parser.add_argument("--trace", action="store_true", help="after each run, where its time went: each link's rate "
                        "per 0.5 s, each client group's first and last byte, and (with --log-level info) which "
                        "node sent each chunk to which")
    try:
        main(parser.parse_args())
    except BenchError as e:
        sys.exit(f"stampede: {e}")
    except KeyboardInterrupt:
        sys.exit("stampede: interrupted (everything it made is deleted)")
