"""The container image (Dockerfile at the repository root), without Docker.

Docker cannot run here, so this checks what can be checked:

* the Dockerfile's facts, by plain line parsing: Python 3.11 slim base, a
  numeric non-root USER, ENTRYPOINT ["nezha"], no [test] extra, and exactly
  the pip commands of the build stage;
* its install, repeated in a temporary folder: the build context as
  .dockerignore lets it through, the build stage's RUN commands with its
  paths (/src, /wheels, /opt/nezha) mapped into the folder, then each
  component's command line run from that clean venv with the runtime stage's
  ENV, the way the image's ENTRYPOINT runs it.

With CI=true a package index that cannot be reached fails the test; locally
it skips.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

from testkit.tools import IN_CI

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Where the build stage puts things in the image.
IMAGE_SRC, IMAGE_WHEELS, IMAGE_VENV = "/src", "/wheels", "/opt/nezha"
# PATH of the python:3.11-slim image, which the runtime ENV PATH extends.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Files in the packages that are not Python and that no code reads at run
# time, so the wheel need not carry them.
NOT_RUNTIME_DATA = {
    # Applied by kubectl or rendered by the chart; webhook/certs.py only names
    # it in an error message.
    "webhook/manifests/mutatingwebhookconfiguration.yaml",
}


# -- Dockerfile parsing ------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions as (KEYWORD, arguments), continuation lines joined, one list per FROM."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[list[tuple[str, str]]] = []
    for ins in instructions:
        if ins[0] == "FROM":
            stages.append([])
        assert stages, f"{ins[0]} before the first FROM"
        stages[-1].append(ins)
    return stages


def args_of(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [a for k, a in stage if k == keyword]


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in args_of(stage, "ENV"):
        for pair in shlex.split(args):
            assert "=" in pair, f"ENV {args!r}: use the KEY=value form"
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def run_segments(stage: list[tuple[str, str]]) -> list[list[str]]:
    """Each command of the stage's RUN instructions (split on &&), as argv."""
    return [shlex.split(part) for args in args_of(stage, "RUN") for part in args.split("&&")]


def is_pip(argv: list[str]) -> bool:
    return bool(argv) and (Path(argv[0]).name.startswith("pip") or argv[1:3] == ["-m", "pip"])


# -- .dockerignore, with Docker's rules: last match wins, a match on a parent folder counts --


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
            continue
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i)
            out += "[" + pattern[i + 1:end].replace("\\", "\\\\") + "]"
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def ignored(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    parts = rel.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for negate, regex in rules:
        if any(regex.fullmatch(c) for c in candidates):
            result = not negate
    return result


def build_context(dest: Path) -> None:
    """Copy what `docker build .` would send (the files .dockerignore lets through) to dest."""
    rules = dockerignore_rules()
    negations = [line for line in DOCKERIGNORE.read_text().splitlines() if line.strip().startswith("!")]
    assert all(not re.search(r"[/*?\[]", n.strip()[1:].rstrip("/")) for n in negations), (
        f"build_context() handles negations of top-level names only: {negations}")
    for folder, dirs, files in os.walk(ROOT):
        rel_folder = Path(folder).relative_to(ROOT).as_posix()
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        # Every negation names a top-level entry (asserted above), so nothing
        # inside an ignored folder is let back in: skip walking it.
        dirs[:] = [d for d in dirs if not ignored(rel_folder + d, rules)]
        for name in files:
            rel = rel_folder + name
            if not ignored(rel, rules):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)


# -- the facts --------------------------------------------------------------------------------


def test_dockerfile_facts():
    stages = dockerfile_stages()
    assert len(stages) >= 1
    bases = [shlex.split(args_of(s, "FROM")[0])[0] for s in stages]
    for base in bases:
        assert re.fullmatch(r"python:3\.11-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base), base
    final = stages[-1]
    # The venv's python is a symlink into the base image: both stages must use the same one.
    assert len(set(bases)) == 1, bases

    users = args_of(final, "USER")
    assert users, "no USER in the final stage: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: runAsNonRoot needs a numeric non-zero uid"
    assert not gid or (gid.isdigit() and int(gid) != 0), f"USER {users[-1]}"
    useradds = [a for a in run_segments(final) if a and a[0] == "useradd"]
    assert useradds and any(f"--uid={uid}" in a or ("--uid" in a and a[a.index("--uid") + 1] == uid)
                            for a in useradds), f"no useradd --uid {uid}"

    assert json.loads(args_of(final, "ENTRYPOINT")[-1]) == ["nezha"]
    assert json.loads(args_of(final, "CMD")[-1]) == ["--help"]

    env = env_of(final)
    assert env["PATH"].split(":")[0] == f"{IMAGE_VENV}/bin", env["PATH"]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    exposed = {p.split("/")[0] for a in args_of(final, "EXPOSE") for p in a.split()}
    assert {"8080", "8443"} <= exposed, exposed

    # The data directory is the only place written at run time: the WORKDIR, owned by the user.
    workdir = args_of(final, "WORKDIR")[-1]
    assert any(a[:1] == ["chown"] and a[1] in (uid, f"{uid}:{gid}") and workdir in a
               for a in run_segments(final)), f"WORKDIR {workdir} is not chowned to {uid}"
    assert f"--from=build {IMAGE_VENV} {IMAGE_VENV}" in args_of(final, "COPY")

    # Only runtime dependencies: no extra of the project (the only one is [test]) anywhere.
    assert list(PYPROJECT["project"]["optional-dependencies"]) == ["test"]
    text = "\n".join(f"{k} {a}" for stage in stages for k, a in stage)  # the instructions, not comments
    assert "[" not in " ".join(a for stage in stages for a in args_of(stage, "RUN")), "an extra is installed"
    assert "requirements" not in text
    for name in PYPROJECT["project"]["optional-dependencies"]["test"]:
        dist = re.split(r"[<>=!~ \[]", name)[0]
        assert not re.search(rf"\b{re.escape(dist)}\b", text, re.I), f"{dist} (a test dependency) in the Dockerfile"

    # pip runs in the build stage only, exactly these commands.
    for stage in stages[1:]:
        assert not any(is_pip(a) for a in run_segments(stage)), "pip in the runtime stage"
    assert [a for a in run_segments(stages[0]) if is_pip(a)] == [
        ["python", "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--wheel-dir", IMAGE_WHEELS, IMAGE_SRC],
        [f"{IMAGE_VENV}/bin/pip", "install", "--no-cache-dir", f"{IMAGE_WHEELS}/*.whl"],
    ]
    # ... and nothing else runs there (the test below repeats these commands on this machine).
    assert run_segments(stages[0]) == [
        ["python", "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--wheel-dir", IMAGE_WHEELS, IMAGE_SRC],
        ["python", "-m", "venv", IMAGE_VENV],
        [f"{IMAGE_VENV}/bin/pip", "install", "--no-cache-dir", f"{IMAGE_WHEELS}/*.whl"],
    ]
    assert args_of(stages[0], "COPY") == [f". {IMAGE_SRC}"]


def test_build_context_holds_what_the_wheel_needs_and_nothing_else():
    rules = dockerignore_rules()
    packages = [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    needed = ["pyproject.toml", PYPROJECT["project"]["readme"]] + [f"{p}/__init__.py" for p in packages]
    for rel in needed:
        assert (ROOT / rel).exists(), rel
        assert not ignored(rel, rules), f"{rel} is needed by the wheel build but .dockerignore leaves it out"
    for rel in [".git/HEAD", ".venv/bin/python", "tests/conftest.py", "bench/x.py", "docs/x.md",
                "helm/nezha/Chart.yaml", "nezha.egg-info/PKG-INFO", "nezha-data/x", "build/lib/x.py",
                "nezha/__pycache__/cli.cpython-311.pyc", "webhook/__pycache__/x.pyc", ".ci/run"]:
        assert ignored(rel, rules), f"{rel} would be sent to the Docker build"


# -- the install, repeated ---------------------------------------------------------------------


def _index_reachable() -> str | None:
    """None if the package index answers, else why not."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            r.read(1)
        return None
    except Exception as e:  # noqa: BLE001 - any failure means: no index
        return f"{url}: {e}"


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


class Image:
    """The build stage's result in a temporary folder, and a way to run the image's ENTRYPOINT."""

    def __init__(self, base: Path) -> None:
        self.src, self.wheels, self.venv = base / "src", base / "wheels", base / "opt-nezha"
        self.workdir, self.tmp = base / "workdir", base / "tmp"
        for d in (self.src, self.wheels, self.workdir, self.tmp):
            d.mkdir()

    def map_path(self, arg: str) -> list[str]:
        for image_path, here in ((IMAGE_SRC, self.src), (IMAGE_WHEELS, self.wheels), (IMAGE_VENV, self.venv)):
            if arg == image_path or arg.startswith(image_path + "/"):
                arg = str(here) + arg[len(image_path):]
                break
        else:
            return [arg]
        return sorted(glob.glob(arg)) or [arg] if any(c in arg for c in "*?[") else [arg]

    def build(self, stage: list[tuple[str, str]]) -> None:
        build_context(self.src)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(env_of(stage))
        for argv in run_segments(stage):
            assert argv[0] in ("python", f"{IMAGE_VENV}/bin/pip"), f"not repeated here: {shlex.join(argv)}"
            if argv[0] == "python":  # the base image's python; here the one running the tests
                argv = [sys.executable] + argv[1:]
            argv = [m for a in argv for m in self.map_path(a)]
            proc = subprocess.run(argv, env=env, cwd=self.src, capture_output=True, text=True, timeout=540)
            if proc.returncode != 0:
                output = (proc.stdout + proc.stderr)[-4000:]
                why = _index_reachable() if is_pip(argv) else None
                if why is not None and not IN_CI:
                    pytest.skip(f"the package index cannot be reached ({why}); {shlex.join(argv)} failed")
                pytest.fail(f"{shlex.join(argv)} exited {proc.returncode}"
                            f"{f' (package index unreachable: {why})' if why else ''}:\n{output}", pytrace=False)
        self.site = Path(glob.glob(str(self.venv / "lib" / "python3*" / "site-packages"))[0])
        self.files = _tree(self.venv)

    def env(self, final: list[tuple[str, str]]) -> dict[str, str]:
        """The runtime stage's ENV, and nothing of this machine's (no NEZHA_*, KUBECONFIG, ...)."""
        env = {"PATH": BASE_PATH, "HOME": "/nonexistent", "LANG": "C.UTF-8", "TMPDIR": str(self.tmp)}
        for key, value in env_of(final).items():
            env[key] = value.replace("$PATH", env.get("PATH", "")).replace(IMAGE_VENV, str(self.venv))
        return env


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Image:
    stages = dockerfile_stages()
    img = Image(tmp_path_factory.mktemp("image"))
    img.build(stages[0])
    img.final = stages[-1]
    return img


def run(image: Image, *args: str) -> subprocess.CompletedProcess:
    """The ENTRYPOINT with `args`, as the container runs it; it must write nothing but its output."""
    entrypoint = json.loads(args_of(image.final, "ENTRYPOINT")[-1])
    proc = subprocess.run(entrypoint + list(args), env=image.env(image.final), cwd=image.workdir,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert _tree(image.venv) == image.files, f"nezha {shlex.join(args)} wrote into the venv"
    assert not any(image.workdir.iterdir()), f"nezha {shlex.join(args)} wrote into the WORKDIR"
    assert not any(image.tmp.iterdir()), f"nezha {shlex.join(args)} wrote into TMPDIR"
    return proc


def venv_python(image: Image, code: str) -> str:
    proc = subprocess.run([str(image.venv / "bin" / "python"), "-c", code], env=image.env(image.final),
                          cwd=image.workdir, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


COMMANDS = ["cache", "verify", "up", "demo", "origin", "ring", "stats", "webhook", "controller", "ca"]


@pytest.mark.timeout(600)
def test_cmd_is_the_help_and_lists_every_component(image):
    proc = run(image, *json.loads(args_of(image.final, "CMD")[-1]))
    assert proc.returncode == 0, proc.stderr
    # nezha.cli skips a component whose package is missing: each must be listed.
    listed = re.findall(r"^    (\w+)", proc.stdout, re.M)
    assert listed == COMMANDS, proc.stdout


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", [*COMMANDS, "webhook certs", "ring show", "ring set", "ca init"])
def test_each_command_line_parses(image, command):
    proc = run(image, *command.split(), "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: nezha {command} "), proc.stdout


# argv -> the last line of stderr: each component's own validation, exit 2, nothing started.
REFUSALS = {
    (): "nezha: error: the following arguments are required: COMMAND",
    ("cache", "--listen", "nope"):
        "nezha cache: --listen 'nope': listen must be HOST:PORT, got 'nope'",
    ("cache", "--capacity", "bogus"):
        "nezha cache: --capacity 'bogus': not a size: 'bogus' "
        "(use bytes or a suffix such as 500M, 10GiB)",
    ("controller",):
        "nezha controller: --namespace is required (or NEZHA_NAMESPACE, or namespace in --config)",
    ("webhook",): "nezha webhook: rules: a rules file is required (--rules)",
    ("webhook", "certs"):
        "nezha webhook: cannot reach the Kubernetes API through the in-cluster service account: ",
    ("up",): "nezha up: no origin configured: pass --origin HOST=UPSTREAM_URL (or NEZHA_ORIGINS, or origins in "
             "--config); without one the node would refuse every request",
    ("up", "--origin", "bad"): "nezha up: --origin 'bad': --origin wants HOST=UPSTREAM_URL, got 'bad'",
    ("demo", "--nodes", "0"): "nezha demo: --nodes 0: must be at least 1",
    ("stats",): "nezha stats: no index to talk to: pass --redis-url URL or set NEZHA_REDIS_URL",
    ("ring", "show"): "nezha ring: no index to talk to: pass --redis-url URL or set NEZHA_REDIS_URL",
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("argv", list(REFUSALS), ids=lambda a: " ".join(a) or "no-command")
def test_each_command_validates(image, argv):
    proc = run(image, *argv)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith(REFUSALS[argv]), proc.stderr
    # Settings errors (ConfigError) are one line; argparse's come after its usage.
    if "error: " not in lines[-1]:
        assert len(lines) == 1, proc.stderr


def _dist(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", requirement)[0]).lower()


@pytest.mark.timeout(600)
def test_only_runtime_dependencies(image):
    report = json.loads(venv_python(image, """if 1:
        import importlib.metadata as md, importlib.util, json, re
        names = ["aiohttp", "redis", "kubernetes_asyncio", "cryptography", "pydantic_settings",
                 "pytest", "hypothesis", "trustme", "kubernetes_validate"]
        print(json.dumps({
            "dists": sorted(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in md.distributions()),
            "importable": [n for n in names if importlib.util.find_spec(n) is not None],
        }))"""))
    dists = set(report["dists"])
    runtime = {_dist(r) for r in PYPROJECT["project"]["dependencies"]}
    test_only = {_dist(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]} - runtime
    assert runtime <= dists, runtime - dists
    assert not test_only & dists, f"test-only packages installed: {sorted(test_only & dists)}"
    assert report["importable"] == ["aiohttp", "redis", "kubernetes_asyncio", "cryptography", "pydantic_settings"]


@pytest.mark.timeout(600)
def test_installed_package_is_complete(image):
    # The venv's own copy is imported, not this checkout.
    where = json.loads(venv_python(image, "import json, nezha, cachenode, controller, webhook; "
                                          "print(json.dumps([m.__file__ for m in (nezha, cachenode, controller, webhook)]))"))
    assert all(Path(f).is_relative_to(image.site) for f in where), where

    packages = [p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    src_files = {p.relative_to(image.src).as_posix() for pkg in packages for p in (image.src / pkg).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    installed = {p.relative_to(image.site).as_posix() for pkg in packages for p in (image.site / pkg).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    python = {f for f in src_files if f.endswith(".py")}
    assert python <= installed, f"modules missing from the wheel: {sorted(python - installed)}"
    data = src_files - python
    missing = data - installed - NOT_RUNTIME_DATA
    assert not missing, f"non-Python files missing from the wheel: {sorted(missing)}"
    # setuptools only warns when the readme is missing from the build context.
    readme = (ROOT / PYPROJECT["project"]["readme"]).read_text().splitlines()[0]
    metadata = glob.glob(str(image.site / "nezha-*.dist-info" / "METADATA"))
    assert len(metadata) == 1 and readme in Path(metadata[0]).read_text(), "README.md missing from the wheel"
    # NOT_RUNTIME_DATA holds only because no code opens files of its own package.
    readers = re.compile(r"__file__|importlib\.resources|importlib_resources|pkgutil\.get_data|pkg_resources")
    for rel in sorted(python):
        assert not readers.search((image.src / rel).read_text()), (
            f"{rel} reads files of its package: check the wheel carries them (NOT_RUNTIME_DATA)")
