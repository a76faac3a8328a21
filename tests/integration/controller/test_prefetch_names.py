"""nezha.io/prefetch by name: hf:// through a Hub double, manifests and index pages, hosts outside the table.

One cache node (in-process) owns every key; the controller reads the
listings from the origins' upstreams and asks the node to fill each object.
Reads afterwards are made as a client of the node's TLS port reaches it (a
peer relaying `https`), so they hit the keys those clients read. Jobs and
Secrets are made with the real kubectl.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections import Counter
from urllib.parse import urljoin, urlsplit

import aiohttp
import pytest
from kubernetes_asyncio import client
from yarl import URL

from cachenode.front.listener import Listener
from nezha.config import Origin
from tests.integration.controller.conftest import STS, ring_becomes
from tests.integration.controller.test_prefetch import job_done, training_job
from tests.support_hub import HubDouble, Repo, served

REPO = "nezha-org/tiny-model"
COMMIT = "5d1e7c4b" * 5
CDN = "cdn-lfs.hf.co"
HUB = "huggingface.co"
CDN_SIGNATURE = ("Expires", "Signature", "Policy", "Key-Pair-Id")


@pytest.fixture
async def hub():
    """A public model repository of two small git files and two LFS files, listed two entries a page."""
    double = HubDouble(Repo(REPO, COMMIT, access="public", tree_page=2,
                            git_files={"config.json": b'{"model_type": "nezha"}\n',
                                       "tokenizer/tokenizer.json": b'{"version": "1.0"}\n'},
                            lfs_files={"model-00001-of-00002.safetensors": os.urandom(300_000),
                                       "model-00002-of-00002.safetensors": os.urandom(200_000)}),
                       cdn_url=f"https://{CDN}")
    async with served(double):
        yield double


def hub_origins(hub: HubDouble) -> list[Origin]:
    """The Hub and its CDN as docs/https.md lists them for public repositories; https is fetched from the
    doubles (tls_upstream), as a cluster fetches it from the real hosts."""
    return [Origin(host=HUB, upstream=hub.hub_url, tls_upstream=hub.hub_url),
            Origin(host=CDN, upstream=hub.cdn_stand_in, tls_upstream=hub.cdn_stand_in,
                   volatile_params=CDN_SIGNATURE)]


async def read_as_a_tls_client(listener: Listener, url: str, *, token: str | None = None) -> tuple[bytes, str]:
    """GET `url` through the node as a client of its TLS port does (relayed as https by a peer, with the
    cluster `token` if the node has one), following redirects as huggingface_hub does; the body and the last
    answer's X-Nezha-Cache."""
    headers = {"X-Nezha-Peer": "test-reader", "X-Nezha-Scheme": "https", **({"X-Nezha-Token": token} if token else {})}
    async with aiohttp.ClientSession() as s:
        for _ in range(5):
            parts = urlsplit(url)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            async with s.get(URL(f"http://127.0.0.1:{listener.port}{path}", encoded=True),
                             headers={**headers, "Host": parts.hostname}, allow_redirects=False) as r:
                if r.status in (302, 307):
                    url = urljoin(url, r.headers["Location"])
                    continue
                assert r.status == 200, (url, r.status, await r.text())
                return await r.read(), r.headers.get("X-Nezha-Cache", "")
    raise AssertionError(f"more than 5 redirects from {url}")


def origin_gets(hub: HubDouble) -> Counter:
    """Object answers (200 or 206 to a GET) by side and path: what crossed the internet."""
    got: Counter = Counter()
    for (side, method, path, status), n in hub.answers.items():
        if method == "GET" and status in (200, 206) and not path.startswith(("/api/models", "/api/datasets")):
            got[(side, path)] += n
    return got


async def test_an_hf_model_is_listed_at_one_commit_and_every_file_is_filled_once_and_served_warm(
        kube, ns, cluster, run_controller, index, hub, one_node, kubectl):
    listener = await one_node(hub_origins(hub))
    await run_controller(peer_address="pod-ip", origins=hub_origins(hub))
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    await kubectl.create(training_job("finetune-1", f"hf://{REPO}"))
    await kubectl.create(training_job("finetune-2", f"hf://{REPO}@main"))
    first, events = await job_done(batch, cluster.core, ns, "finetune-1")
    second, _ = await job_done(batch, cluster.core, ns, "finetune-2")
    files = hub.repo.files
    size = sum(len(b) for b in files.values())
    assert first == {"total": 4, "done": 4, "failed": [], "bytes": size, "pinned": size,
                     "expanded_from": [{"name": f"hf://{REPO}", "objects": 4, "revision": "main", "commit": COMMIT}]}
    assert second["done"] == 4 and second["expanded_from"][0]["commit"] == COMMIT
    assert not [e for e in events if e.type == "Warning"]
    # The tree was read in pages (two entries each, folders among them), and the revision once per Job.
    tree = sum(n for (side, m, path, status), n in hub.answers.items() if path.endswith(f"/tree/{COMMIT}"))
    assert tree >= 3

    fetched = origin_gets(hub)
    assert set(fetched.values()) == {1}, f"one fill per file: {fetched}"
    assert len(fetched) == 4
    for path, body in files.items():
        got, cache = await read_as_a_tls_client(listener, f"https://{HUB}/{REPO}/resolve/main/{path}")
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest(), path
        # The double's answers carry no lifetime (an ETag only): the copy is served after the origin's 304.
        assert cache == "revalidated", (path, cache)
    assert origin_gets(hub) == fetched, "a warm read fetched an object from the origin again"


@pytest.fixture
async def dataset_hub():
    """A public dataset repository: a card kept in git and two parquet shards in LFS, a folder among them."""
    double = HubDouble(Repo("nezha-org/tiny-set", COMMIT, access="public", kind="dataset", tree_page=2,
                            git_files={"README.md": b"# tiny-set\n"},
                            lfs_files={"data/train-00000-of-00002.parquet": os.urandom(250_000),
                                       "data/train-00001-of-00002.parquet": os.urandom(150_000)}),
                       cdn_url=f"https://{CDN}")
    async with served(double):
        yield double


async def test_an_hf_dataset_at_a_commit_is_filled_once_per_file_and_read_back_exact_at_that_commit(
        kube, ns, cluster, run_controller, index, dataset_hub, one_node, kubectl):
    hub = dataset_hub
    listener = await one_node(hub_origins(hub))
    await run_controller(peer_address="pod-ip", origins=hub_origins(hub))
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    await kubectl.create(training_job("tokenize", f"hf://datasets/{hub.repo.name}@{COMMIT}"))
    status, events = await job_done(client.BatchV1Api(kube), cluster.core, ns, "tokenize")
    size = sum(len(b) for b in hub.repo.files.values())
    assert (status["total"], status["done"], status["failed"], status["bytes"]) == (3, 3, [], size), status
    [expanded] = status["expanded_from"]
    assert (expanded["name"], expanded["objects"], expanded["commit"]) == (
        f"hf://datasets/{hub.repo.name}@{COMMIT}", 3, COMMIT)
    assert not [e for e in events if e.type == "Warning"]
    fetched = origin_gets(hub)
    assert len(fetched) == 3 and set(fetched.values()) == {1}, f"one fill per file: {fetched}"
    assert all("/api/models" not in path for (_, _, path, _) in hub.answers), "a dataset was listed as a model"
    for path, body in hub.repo.files.items():
        got, _ = await read_as_a_tls_client(listener, f"https://{HUB}/datasets/{hub.repo.name}/resolve/{COMMIT}/{path}")
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest(), path
    assert origin_gets(hub) == fetched, "a warm read fetched an object from the origin again"


async def test_a_manifest_and_an_index_page_expand_to_the_objects_they_list(
        kube, ns, cluster, run_controller, index, origin, one_node, kubectl):
    host = "data.example"
    for i in range(3):
        origin.put(f"/sets/a/{i}.bin", bytes([i]) * 10_000, headers={"Cache-Control": "max-age=3600"})
    origin.put("/sets/files.txt", b"# three shards\n0.bin\n/sets/a/1.bin\n\nhttp://data.example/sets/a/2.bin\n"
               .replace(b"0.bin", b"a/0.bin"))
    origin.put("/sets/a/", b'<html><a href="../">..</a><a href="0.bin">0</a><a href="1.bin">1</a>'
                           b'<a href="?C=M">sort</a></html>', headers={"Content-Type": "text/html"})
    table = [Origin(host=host, upstream=origin.url)]
    listener = await one_node(table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    await kubectl.create(training_job(
        "by-list", f"http://{host}/sets/files.txt,http://{host}/sets/a/"))
    status, _ = await job_done(batch, cluster.core, ns, "by-list")
    assert status == {"total": 3, "done": 3, "failed": [], "bytes": 30_000, "pinned": 30_000, "expanded_from": [
        {"name": f"http://{host}/sets/files.txt", "objects": 3}, {"name": f"http://{host}/sets/a/", "objects": 2}]}
    assert [origin.requests[f"/sets/a/{i}.bin"] for i in range(3)] == [1, 1, 1]


async def test_a_name_that_expands_to_a_host_outside_the_origin_table_is_refused_with_a_warning_and_nothing_fetched(
        kube, ns, cluster, run_controller, index, origin, one_node, kubectl):
    host = "data.example"
    origin.put("/ok.bin", b"k" * 1000, headers={"Cache-Control": "max-age=3600"})
    origin.put("/m/files.txt", f"http://{host}/ok.bin\nhttps://evil.example/steal.bin\n".encode())
    table = [Origin(host=host, upstream=origin.url)]
    listener = await one_node(table)
    await run_controller(peer_address="pod-ip", origins=table)
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)

    batch = client.BatchV1Api(kube)
    await kubectl.create(training_job("outside", f"http://{host}/m/files.txt,hf://org/model"))
    status, events = await job_done(batch, cluster.core, ns, "outside")
    assert status["total"] == 2 and status["done"] == 0 and "expanded_from" not in status
    assert [f["url"] for f in status["failed"]] == [f"http://{host}/m/files.txt", "hf://org/model"]
    warnings = [e.message for e in events if e.type == "Warning" and e.reason == "PrefetchRefused"]
    assert any(f"http://{host}/m/files.txt" in m and "evil.example" in m and "nothing of it" in m for m in warnings)
    assert any("hf://org/model" in m and HUB in m for m in warnings), warnings
    assert origin.requests.get("/ok.bin", 0) == 0, "nothing of a refused name is fetched"


HF_TOKEN = "hf_nezhaPrefetchReader0001"
CLUSTER_TOKEN = "nezha-test-cluster-token-0002"


@pytest.fixture
async def private_hub():
    """A private model repository: the API, resolve and resolve-cache answer only the granted token."""
    double = HubDouble(Repo("nezha-org/private-model", COMMIT, access="private", granted={HF_TOKEN},
                            git_files={"config.json": b'{"model_type": "private"}\n'},
                            lfs_files={"model.safetensors": os.urandom(400_000)}), cdn_url=f"https://{CDN}")
    async with served(double):
        yield double


async def test_a_private_hf_model_is_prefetched_with_the_workloads_token_and_a_reader_without_one_is_denied(
        kube, ns, cluster, run_controller, index, private_hub, one_node, tmp_path, kubectl):
    hub = private_hub
    # docs/recipes/hugging-face.md's origins: credentials: authorize on the Hub and its CDN.
    table = [Origin(host=HUB, upstream=hub.hub_url, tls_upstream=hub.hub_url, credentials="authorize"),
             Origin(host=CDN, upstream=hub.cdn_stand_in, tls_upstream=hub.cdn_stand_in, credentials="authorize")]
    listener = await one_node(table, cluster_token=CLUSTER_TOKEN)
    (tmp_path / "token").write_text(CLUSTER_TOKEN)
    await run_controller(peer_address="pod-ip", origins=table, cluster_token_file=tmp_path / "token")
    await ring_becomes(index, {f"{STS}-0": f"127.0.0.1:{listener.port}"}, timeout=10)
    await kubectl.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"},
                          "data": {"HF_TOKEN": base64.b64encode(HF_TOKEN.encode()).decode()}})

    batch = client.BatchV1Api(kube)
    job = training_job("private-model", f"hf://{hub.repo.name}")
    job["metadata"]["annotations"]["nezha.io/prefetch-secret"] = "hf"
    await kubectl.create(job)
    status, events = await job_done(batch, cluster.core, ns, "private-model")
    assert (status["done"], status["total"], status["failed"]) == (2, 2, []), (status, [e.message for e in events])
    assert status["expanded_from"][0]["commit"] == COMMIT
    fetched = origin_gets(hub)
    assert len(fetched) == 2 and set(fetched.values()) == {1}, fetched

    # Without the token the Hub does not even list it.
    await kubectl.create(training_job("no-token", f"hf://{hub.repo.name}"))
    status, _ = await job_done(batch, cluster.core, ns, "no-token")
    assert status["done"] == 0 and "401" in status["failed"][0]["reason"]

    # A reader with the token: every file from the copy, after the origin allowed it.
    token = {"Authorization": f"Bearer {HF_TOKEN}"}
    for path, body in hub.repo.files.items():
        got, cache = await read(listener, f"https://{HUB}/{hub.repo.name}/resolve/main/{path}", token)
        assert got == body and cache == "authorized", (path, cache)
    assert origin_gets(hub) == fetched, "a warm read fetched an object from the origin again"
    # A reader without one asks for the stored copies' own URLs: the origins refuse, no byte of them leaves.
    etag = hashlib.sha1(b"blob %d\0" % len(hub.repo.git_files["config.json"])
                        + hub.repo.git_files["config.json"]).hexdigest()
    oid = hashlib.sha256(hub.repo.lfs_files["model.safetensors"]).hexdigest()
    signed = hub.signed(oid, "model.safetensors")
    forged = re.sub(r"Signature=[0-9a-f]+", "Signature=" + "0" * 64, signed)
    assert forged != signed
    stolen = [f"https://{HUB}/api/resolve-cache/models/{hub.repo.name}/{COMMIT}/config.json?etag=%22{etag}%22",
              forged]
    for url in stolen:
        status_code, cache, got, _ = await read_once(listener, url, {})
        assert status_code in (401, 403) and cache == "denied", (url, status_code, cache)
        assert not any(body[:64] in got for body in hub.repo.files.values())


async def read_once(listener: Listener, url: str, headers: dict[str, str]) -> tuple[int, str, bytes, str]:
    """One GET of `url` through the node as the TLS port's clients arrive (a peer relaying https, with the
    cluster token): status, X-Nezha-Cache, body and Location."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    async with aiohttp.ClientSession() as s:
        async with s.get(URL(f"http://127.0.0.1:{listener.port}{path}", encoded=True), allow_redirects=False, headers={
                "Host": parts.hostname, "X-Nezha-Peer": "test-reader", "X-Nezha-Scheme": "https",
                "X-Nezha-Token": CLUSTER_TOKEN, **headers}) as r:
            return r.status, r.headers.get("X-Nezha-Cache", ""), await r.read(), r.headers.get("Location", "")


async def read(listener: Listener, url: str, token: dict[str, str]) -> tuple[bytes, str]:
    """As huggingface_hub reads a file: the token to the Hub, none to the CDN its redirect names."""
    for _ in range(5):
        status, cache, body, location = await read_once(listener, url, token if urlsplit(url).hostname == HUB else {})
        if status not in (302, 307):
            assert status == 200, (url, status, body[:200])
            return body, cache
        url = urljoin(url, location)
    raise AssertionError(f"more than 5 redirects from {url}")
