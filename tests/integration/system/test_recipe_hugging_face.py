"""docs/recipes/hugging-face.md, followed literally on the whole system.

The chart's values, the Secret, both Jobs and the check commands are the
page's blocks (tests/integration/system/recipe.py). The chart is installed
with those values into the API double and its pods run as processes
(minicluster.py); each Job's pod is the one admission made, and its own
command runs with the environment, CA volume and hostAliases the webhook
gave it: unmodified `huggingface_hub` (and curl, for the check) reach a
cache node's port 443 through the aliases for `huggingface.co` and
`cdn-lfs.hf.co` and trust the Nezha CA through the variables the rule set.

The Hub and its CDN are tests/support_hub.py's double (a gated
repository: 401 without a token, LFS files redirected to signed CDN URLs),
on two loopback addresses; the origins' upstreams name them (the one thing
changed from the page). Its counters say what crossed "the internet".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.integration.system.conftest import installed_chart
from tests.integration.system.recipe import (RECIPES, answered, blocks, commands, fill, kubectl, logs_of,
                                             requests_of, run_job, stand_in, stats_row, values_of)
from tests.integration.system.test_whole_system import chart_is_up
from tests.support_hub import HubDouble, Repo, served

pytestmark = pytest.mark.timeout(240)

PAGE = RECIPES / "hugging-face.md"
REPO = "nezha-org/gated-model"
TOKEN = "hf_nezhaRecipeReader0001"  # granted access to the gated repository
CDN = "cdn-lfs.hf.co"


@pytest.fixture
async def hub():
    """The Hub on 127.0.0.7 and its CDN on 127.0.0.8, each on a free port; redirects name the CDN by its
    real name, which the job's pod aliases to the cache."""
    model = os.urandom(2 * 1024 * 1024)
    double = HubDouble(Repo(REPO, "9c3e1f0a" * 5, git_files={"config.json": b'{"model_type": "nezha"}\n'},
                            lfs_files={"model.safetensors": model}, granted={TOKEN}), cdn_url=f"https://{CDN}")
    async with served(double):
        yield double


@pytest.fixture
async def system(tmp_path, request, hub):
    values = values_of(blocks(PAGE)["values"])
    where = {o["host"]: hub.cdn_stand_in for o in values["origins"] if o["host"] != "huggingface.co"}
    values = stand_in(values, {"huggingface.co": hub.hub_url, **where})
    async for installed in installed_chart(tmp_path, request, values):
        yield installed


def downloaded(output: str) -> dict[str, bytes]:
    """What the job printed (`name path` a line): each file's bytes, as hf_hub_download left them."""
    return {name: Path(path).read_bytes() for name, path in (line.split(" ", 1) for line in output.splitlines())}


async def test_the_hugging_face_recipe_stores_a_gated_file_once_and_lets_each_reader_have_it_only_with_consent(
        system, hub, request):
    page = blocks(PAGE)
    repo = hub.repo
    files = {f"{name}.yaml": system.root / f"{name}.yaml" for name in ("fetch-gated-model", "check-gated-model")}
    files["fetch-gated-model.yaml"].write_text(page["job"])
    files["check-gated-model.yaml"].write_text(page["check-job"])
    job, check = yaml.safe_load(page["job"]), yaml.safe_load(page["check-job"])
    (rule,) = values_of(page["values"])["webhook"]["rules"]
    hosts = rule["hostAliases"][0]["hostnames"]
    await chart_is_up(system)
    await system.mini.wait("the controller's copy of nezha-ca in the Job's namespace",
                           lambda: system.obj("", "configmaps", "nezha-ca", ns="ml"), timeout=60)

    # 2. The token and the Job, as the page types them; the job's own huggingface_hub downloads both files.
    for argv in commands(fill(page["secret"], {"hf_YOUR_TOKEN": TOKEN})):
        await kubectl(system, argv)
    for argv in commands(page["run-job"]):
        await kubectl(system, argv, files=files)
    seen: set[str] = set()
    _, env, out = await run_job(system, request, job, seen, hosts=hosts)
    assert env["SSL_CERT_FILE"] == "/etc/nezha/ca/ca-bundle.crt"  # what huggingface_hub's client trusts
    assert downloaded(out) == {**repo.git_files, **repo.lfs_files}
    model = repo.lfs_files["model.safetensors"]
    assert hub.sent["cdn"] == len(model)
    sent = dict(hub.sent)

    # A second run (a new pod, an empty ~/.cache/huggingface): every byte from the cache, after consent.
    for argv in commands(page["rerun"]):
        await kubectl(system, argv, files=files)
    _, _, out = await run_job(system, request, job, seen, hosts=hosts)
    assert downloaded(out) == {**repo.git_files, **repo.lfs_files}
    assert dict(hub.sent) == sent, "a file crossed the internet again"

    # 3. The check Job: the Hub's 401 through the cache, and the CDN's consent to this pod's signed URL.
    for argv in commands(page["run-check"]):
        if "logs" in argv:
            assert answered(logs_of(argv, check, out), page["check-log"]), out
        else:
            await kubectl(system, argv, files=files)
            _, _, out = await run_job(system, request, check, seen, hosts=hosts)
    assert dict(hub.sent) == sent
    statuses = {(side, status) for side, _, _, status in hub.answers}
    assert ("hub", 401) in statuses and ("cdn", 304) in statuses and ("hub", 304) in statuses, hub.answers

    # The cache's own account, as the page asks for it (the counts reach Redis within seconds).
    async def counted() -> tuple[dict[str, str], dict[str, str]] | None:
        cdn, hub_row = (await stats_row(system, page["stats"], CDN)), (await stats_row(system, page["stats"],
                                                                                     "huggingface.co"))
        return (cdn, hub_row) if requests_of(cdn) >= (2, 1) and requests_of(hub_row) >= (1, 1) else None

    cdn, hub_row = await system.mini.wait("the reads in nezha stats", counted, timeout=20)
    assert requests_of(cdn) == (2, 1), cdn
    assert cdn["FROM ORIGIN"] == "2.0 MiB", cdn
    assert requests_of(hub_row) == (1, 1), hub_row
