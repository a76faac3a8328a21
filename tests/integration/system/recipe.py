"""A recipe page (docs/recipes/*.md) as its whole-system test follows it.

The page is the test's script: what the user types (the chart's values,
a Secret, a Job, the commands that check it) is read from the page's
fenced code blocks, so the page cannot say one thing while the test does
another. A block the test uses carries `recipe=NAME` in its info string
(```` ```yaml recipe=values ````); renderers use only the first word, the
language, so the reader sees an ordinary block.

Two things are not the page's, and each is done in one named place here:
where the cloud is (`stand_in`: the origin's upstream becomes the local
stand-in's address, since nothing leaves this machine), and the secrets a
user pastes (`fill`: the page's placeholders become the test's keys).
What the API double cannot serve is done as the cluster would: a Job's
pod is run here (`run_job`) and `kubectl logs` reads its output
(`logs_of`).
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import yaml
from markdown_it import MarkdownIt

from tests.integration.system.podspec import resolve_env
from tests.pod_command import mount_point, run_pod_command

RECIPES = Path(__file__).resolve().parents[3] / "docs" / "recipes"


def blocks(page: Path) -> dict[str, str]:
    """The page's fenced blocks marked `recipe=NAME`, by NAME. A name used twice is an error: the test
    would follow one and the reader might copy the other."""
    out: dict[str, str] = {}
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        if token.type != "fence":
            continue
        for word in token.info.split()[1:]:
            if word.startswith("recipe="):
                name = word.split("=", 1)[1]
                assert name not in out, f"{page.name}: two blocks marked recipe={name}"
                out[name] = token.content
    return out


def stand_in(values: dict, where: dict[str, str]) -> dict:
    """The chart values with each named origin fetched from its local stand-in instead of the cloud.

    The page's entry must fetch the host itself (`upstream: https://<host>`), as a user's does; the stand-in
    speaks plain HTTP on loopback, so both the upstream and the TLS clients' upstream (`tlsUpstream`) name
    it. Nothing else of the values changes."""
    out = copy.deepcopy(values)
    entries = {o["host"]: o for o in out["origins"]}
    for host, url in where.items():
        entry = entries[host]
        assert entry["upstream"] == f"https://{host}", f"{host}: the page's upstream is {entry['upstream']}"
        assert "tlsUpstream" not in entry, f"{host}: the page sets tlsUpstream itself"
        entry["upstream"] = entry["tlsUpstream"] = url
    return out


def fill(text: str, values: dict[str, str]) -> str:
    """`text` with each placeholder replaced; every placeholder must be on the page."""
    for placeholder, value in values.items():
        assert placeholder in text, f"{placeholder} is not in {text!r}"
        text = text.replace(placeholder, value)
    return text


def commands(block: str) -> list[list[str]]:
    """A shell block's commands (one a line, `\\` continuing one), each split as sh would split it;
    comments and blank lines are left out."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def values_of(block: str) -> dict:
    return yaml.safe_load(block)


async def kubectl(system, argv: list[str], *, files: dict[str, Path] | None = None) -> str:
    """A `kubectl ...` line of the page, run against the double; a file it names is the one given. The
    double serves no OpenAPI documents for kubectl's client-side validation (conftest's `helm install`
    says --disable-openapi-validation for the same reason): `apply` is told not to ask for them."""
    assert argv[0] == "kubectl", argv
    args = [str((files or {}).get(a, a)) for a in argv[1:]]
    if "apply" in args:
        args.append("--validate=false")
    return await system.run(*system.kubectl, *args)


async def run_job(system, request, job: dict, seen: set[str], *, hosts: list[str]) -> tuple[dict, dict, str]:
    """The pod admission made for `job` (one not in `seen`), its own command run as the kubelet would: the
    pod's hostAliases (which must send `hosts` to the cache Service), its env (Secrets resolved), its nezha-ca
    volume at /etc/nezha/ca, and a home of its own (a new container's filesystem starts empty).
    Returns the pod, its container's env and the command's output."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    pod = await system.mini.wait(f"the pod of Job {name}", lambda: next(
        (p for (n, pn), p in system.api.objects_of("", "pods").items()
         if n == ns and p["metadata"]["labels"].get("job-name") == name and pn not in seen), None), timeout=10)
    seen.add(pod["metadata"]["name"])
    assert pod["spec"].get("hostAliases") == [{"ip": system.service_ip("nezha-cache"), "hostnames": hosts}], \
        f"{pod['spec'].get('hostAliases')}; admission: {system.api.admission_calls[-1:]}"
    secrets = {s["metadata"]["name"]: s for (n, _), s in system.api.objects_of("", "secrets").items() if n == ns}
    env = resolve_env(pod, pod["spec"]["containers"][0], secret=secrets.get, configmap=lambda _: None)
    workdir = system.root / "jobs" / pod["metadata"]["name"]
    volume, home = workdir / "nezha-ca", workdir / "home"
    for folder in (volume, home):
        folder.mkdir(parents=True)
    for key, value in system.obj("", "configmaps", "nezha-ca", ns=ns)["data"].items():
        volume.joinpath(key).write_text(value)
    out = await run_pod_command(pod, workdir, env={**env, "HOME": str(home)},
                                mounts={str(mount_point(request, Path("/etc/nezha/ca"))): volume},
                                context=system.mini.logs())
    return pod, env, out


def logs_of(argv: list[str], job: dict, output: str) -> str:
    """`kubectl -n NS logs job/NAME`, which the double cannot serve: the command's output, once the line
    is checked to name this Job."""
    assert argv == ["kubectl", "-n", job["metadata"]["namespace"], "logs", f"job/{job['metadata']['name']}"], argv
    return output


def answered(output: str, expected: str) -> bool:
    """The Job's log is the page's text, or the same with an answer relayed by a node that does not own
    the object (`peer-` before the X-Nezha-Cache value), as the pages say it may be."""
    relayed = "\n".join(line.replace("X-Nezha-Cache: ", "X-Nezha-Cache: peer-")
                         for line in expected.strip().splitlines())
    return output.strip() in (expected.strip(), relayed)


async def stats_row(system, block: str, host: str) -> dict[str, str]:
    """The page's `kubectl -n NS exec POD -- nezha stats`, run in that pod; the row of `host`."""
    ((kubectl_, ns_flag, ns, verb, pod_name, dashes, *command),) = commands(block)
    assert (kubectl_, ns_flag, verb, dashes) == ("kubectl", "-n", "exec", "--") and ns == system.mini.namespace
    return host_row(await system.mini.exec(pod_name, command), host)


def host_row(table: str, host: str) -> dict[str, str]:
    """A row of `nezha stats`' table by its column names (cells are aligned under the header)."""
    header, *rows = table.splitlines()
    names = [n for n in header.split("  ") if n.strip()]
    starts = [header.index(n) for n in names]
    for row in rows:
        cells = [row[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if cells[:2] == ["host", host]:
            return dict(zip([n.strip() for n in names], cells))
    raise AssertionError(f"no row for host {host}:\n{table}")


def requests_of(row: dict[str, str]) -> tuple[int, int]:
    """(hits, misses) of a stats row: a hit counts where the request entered, as HITS or PEER."""
    return int(row["HITS"]) + int(row["PEER"]), int(row["MISSES"])
