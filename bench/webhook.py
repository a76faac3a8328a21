#!/usr/bin/env python3
"""Admission latency of `nezha webhook` over TLS at a fixed request rate.

One run: a `nezha webhook` process (real TLS from a throwaway trustme CA, the
rules of the original Nezha ConfigMap, `--cache-ip`) receives AdmissionReview
v1 requests at 200 requests/s for 20 s (5 s with --quick) from 32 concurrent
clients, each its own keep-alive TLS connection, as kube-apiserver keeps
them. The schedule is open-loop: request i is due at start + i/rate, and its
latency is measured from when it was due, so a stalled server cannot hide
behind clients that wait for it. A 1 s warm-up is not counted.

Reviews rotate over four shapes: a labelled Pod without hostAliases, one with
its own hostAliases, an already-patched Pod (reinvocation: no patch) and a
labelled Job. Every answer is checked: status 200, uid echoed, allowed, and a
patch where one is due; anything else counts as an error.

The last line is machine-readable:

    ratios: admission_p99_ms=<p99> errors=<n>

Target (issue 5): p99 < 10 ms, 0 errors. Everything on 127.0.0.1. Needs trustme
and psutil (the test extras). Not collected by pytest.

This file shares its name with the `webhook` package and must not import it:
run as a script, bench/ comes first on sys.path. The server under test is a
separate `python -m nezha webhook` process started from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import trustme

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after bench/: testkit, never the webhook package

from bench.harness import Sampler  # noqa: E402
from testkit.ports import free_port  # noqa: E402
from testkit.waits import NotAnswering, until_http  # noqa: E402

RULES = """\
- name: dataset
  app: app.kubernetes.io/deploy-manager
  label: ksonnet
  hostAliases:
    - ip: "10.106.122.174"
      hostnames: [download.tensorflow.org, yann.lecun.com, www.cs.toronto.edu, storage.googleapis.com,
                  images.cocodataset.org]
"""
LABELS = {"app.kubernetes.io/deploy-manager": "ksonnet", "app": "train"}
HOSTS = ["download.tensorflow.org", "yann.lecun.com", "www.cs.toronto.edu", "storage.googleapis.com",
         "images.cocodataset.org"]


def pod_spec(host_aliases=None) -> dict:
    spec = {"restartPolicy": "Never", "containers": [{
        "name": "train", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "command": ["python", "train.py", "--data", "/data"],
        "env": [{"name": "EPOCHS", "value": "10"}],
        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}]}
    if host_aliases is not None:
        spec["hostAliases"] = host_aliases
    return spec


def shapes() -> list[tuple[str, dict, bool]]:
    """(kind, object, patch expected)."""
    def pod(spec, annotations=None):
        meta = {"generateName": "train-", "namespace": "ml", "labels": dict(LABELS)}
        if annotations:
            meta["annotations"] = annotations
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml"},
           "spec": {"backoffLimit": 2, "template": {"metadata": {"labels": dict(LABELS)}, "spec": pod_spec()}}}
    return [
        ("Pod", pod(pod_spec()), True),
        ("Pod", pod(pod_spec([{"ip": "192.168.0.5", "hostnames": ["registry.local"]}])), True),
        ("Pod", pod(pod_spec([{"ip": "10.106.122.174", "hostnames": HOSTS}]), {"nezha.io/injected": "dataset"}),
         False),
        ("Job", job, True),
    ]


def review(kind: str, obj: dict) -> tuple[str, bytes]:
    uid = str(uuid.uuid4())
    group, _, version = obj["apiVersion"].rpartition("/")
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:ml:trainer"},
        "object": obj, "oldObject": None, "dryRun": False}}
    return uid, json.dumps(body).encode()


async def run_load(url: str, ctx: ssl.SSLContext, *, rate: float, seconds: float, clients: int,
                   warmup: float) -> tuple[list[float], list[str], int]:
    """Open-loop load; returns latencies (ms, counted part), error descriptions, requests sent."""
    templates = shapes()
    total = int((warmup + seconds) * rate)
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    latencies: list[float] = []
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2

    async def client() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as s:
            while (i := await queue.get()) is not None:
                kind, obj, patch_due = templates[i % len(templates)]
                uid, body = review(kind, obj)
                due = start + i / rate
                try:
                    async with s.post(f"{url}/mutate", data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        text = await r.read()
                        status = r.status
                    done = loop.time()
                    problem = check(status, text, uid, patch_due)
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    done, problem = loop.time(), f"{type(e).__name__}: {e}"
                if due - start >= warmup:
                    latencies.append((done - due) * 1000)
                    if problem:
                        errors.append(problem)

    workers = [asyncio.create_task(client()) for _ in range(clients)]
    for i in range(total):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        queue.put_nowait(i)
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    return latencies, errors, total


def check(status: int, text: bytes, uid: str, patch_due: bool) -> str | None:
    if status != 200:
        return f"status {status}: {text[:100]!r}"
    try:
        resp = json.loads(text)["response"]
    except (ValueError, KeyError):
        return "not an AdmissionReview response"
    if resp.get("uid") != uid or resp.get("allowed") is not True:
        return "uid not echoed or not allowed"
    if patch_due:
        if resp.get("patchType") != "JSONPatch":
            return "patch missing"
        ops = json.loads(base64.b64decode(resp["patch"]))
        if not any("hostAliases" in op["path"] for op in ops):
            return "patch without hostAliases"
    elif "patch" in resp:
        return "patch on an already patched pod"
    return None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s instead of 20 s")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent TLS clients (default 32)")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds (default 20; 5 quick)")
    args = parser.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 20.0)

    with tempfile.TemporaryDirectory(prefix="nezha-bench-webhook-") as tmp:
        d = Path(tmp)
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        leaf.private_key_pem.write_to_path(str(d / "tls.key"))
        (d / "tls.crt").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
        (d / "rules.yaml").write_text(RULES)
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        log = open(d / "webhook.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "nezha", "webhook", "--listen", f"127.0.0.1:{port}",
                                 "--tls-cert", str(d / "tls.crt"), "--tls-key", str(d / "tls.key"),
                                 "--rules", str(d / "rules.yaml"), "--cache-ip", "10.96.0.10"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            try:
                await until_http(f"{url}/healthz", timeout=20, proc=proc, log=d / "webhook.log",
                                 what="nezha webhook", ssl=ctx, interval=0.1)
            except NotAnswering as e:
                raise SystemExit(f"webhook did not become ready: {e}") from None
            server = Sampler(proc.pid, tree=False)  # read before and after the load, not sampled during it
            cpu0, t0 = server.tree_cpu(), time.monotonic()
            latencies, errors, sent = await run_load(url, ctx, rate=args.rate, seconds=seconds,
                                                     clients=args.clients, warmup=1.0)
            cpu = (server.tree_cpu() - cpu0) / (time.monotonic() - t0)
            rss = server.tree_rss() / 2**20
        finally:
            signal.signal(signal.SIGTERM, previous)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            log.close()
        lines = sum(1 for _ in open(d / "webhook.log", "rb"))

    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    print(f"Webhook admission latency ({'quick' if args.quick else 'full'}; {os.cpu_count()} CPUs; "
          f"{args.rate:.0f} req/s for {seconds:.0f} s after 1 s warm-up; {args.clients} TLS clients)")
    print(f"  requests measured   {len(latencies)} (of {sent} sent)")
    print(f"  latency p50         {p50:.2f} ms")
    print(f"  latency p90         {percentile(latencies, 90):.2f} ms")
    print(f"  latency p99         {p99:.2f} ms")
    print(f"  latency max         {max(latencies):.2f} ms")
    print(f"  latency mean        {statistics.fmean(latencies):.2f} ms")
    print(f"  errors              {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    print(f"  webhook cpu         {cpu * 100:.0f}% of one core; RSS {rss:.1f} MiB; {lines} log lines")
    met = p99 < 10 and not errors
    print(f"  target p99 < 10 ms and 0 errors: {'met' if met else 'NOT met'}")
    print(f"ratios: admission_p99_ms={p99:.2f} errors={len(errors)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
