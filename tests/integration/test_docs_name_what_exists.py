"""What `docs/*.md` names exists: every `nezha` flag, every chart value, every `/readyz` key, every module
path, and the one connection-cap formula is the node's.

tests/integration/chart/test_chart_docs.py does this for the chart's README;
here the same holds for the guides. The Markdown is read as CommonMark reads
it (markdown-it-py), so only what a reader sees as code is taken for a name:
inline code spans, fenced and indented blocks. Each name is checked against
the thing itself: flags against the argparse parsers `nezha` runs, values
against the chart's values.yaml, `/readyz` keys against the JSON a real
`nezha cache` with a real Redis answers, and the formula against the cap
that process logs.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from markdown_it import MarkdownIt

from testkit.ports import free_port
from testkit.waits import until_http

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
VALUES = yaml.safe_load((ROOT / "helm" / "nezha" / "values.yaml").read_text())

# Flags of other programs that the guides name in a code span of their own,
# with the program: never taken for a `nezha` flag.
FOREIGN_FLAGS = {"--set": "helm", "--resolve": "curl", "--no-sign-request": "aws s3", "--threads": "py-spy"}
# Programs whose command lines the guides show; their flags are theirs.
FOREIGN_COMMANDS = {"kubectl", "helm", "curl", "wget", "docker", "aws", "redis-cli", "py-spy", "sh", "bash", "openssl",
                    "kind", "pip", "git", "sudo", "ulimit", "for", "export", "cd", "ls", "cat", "echo", "jq"}
# Dotted names that start like a chart value but are not one: files, modules, host names.
NOT_A_VALUE = re.compile(r"\.(md|py|yaml|yml|json|txt|tpl)$|\.svc\b|^redis\.ml$|^[a-z_]+\.[a-z_]+\.[A-Z_]+$")
VALUE_SPAN = re.compile(r"^(?:--set )?((?:%s)(?:\.[A-Za-z0-9_]+)+)(?:[:=].*)?$" % "|".join(map(re.escape, VALUES)))
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


@dataclass(frozen=True)
class Code:
    doc: Path
    text: str
    span: bool  # an inline span; else a line of a fenced or indented block
    paragraph: str  # the text of the paragraph, list item or table a span is in ("" for blocks)


def code_in(doc: Path) -> Iterator[Code]:
    for token in MarkdownIt("commonmark").parse(doc.read_text()):
        if token.type in ("fence", "code_block"):
            # A trailing backslash continues a shell line; so does an indented `[--flag ...]` of a usage block.
            text = re.sub(r"\\\n\s*", " ", token.content)
            text = re.sub(r"\n\s+(?=\[?--)", " ", text)
            for line in text.splitlines():
                yield Code(doc, line.strip(), False, "")
        elif token.type == "inline":
            for child in token.children or ():
                if child.type == "code_inline":
                    yield Code(doc, child.content.strip(), True, token.content)


def parsers() -> dict[tuple[str, ...], set[str]]:
    """The options of every command `nezha` takes, by command path (`("webhook", "certs")`)."""
    from nezha.cli import build_parser

    out: dict[tuple[str, ...], set[str]] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        out[path] = {s for a in parser._actions for s in a.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(path + (name,), sub)

    walk((), build_parser())
    return out


def bench_flags(script: str) -> set[str]:
    """The flags a bench script declares (read, not run: bench/ is never imported by the tests)."""
    return set(re.findall(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"", (ROOT / script).read_text()))


def commands(line: str) -> Iterator[list[str]]:
    """The words of each simple command on a shell line (split at |, &&, ||, ; and $( )."""
    for part in re.split(r"\|\||&&|[|;]|\$\(|`", line):
        words = part.split()
        # A prompt, and variables set for the one command (`NEZHA_LOG_LEVEL=debug nezha ...`).
        while words and (words[0] == "$" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
            words = words[1:]
        if words:
            yield [words[0].rsplit("/", 1)[-1] if words[0].endswith("/nezha") else words[0], *words[1:]]


def flag_errors(code: Code, tree: dict[tuple[str, ...], set[str]], every_flag: set[str]) -> Iterator[str]:
    where = f"{code.doc.relative_to(ROOT)}: `{code.text}`"
    for words in commands(code.text):
        if words[0] in ("python", "python3") and words[1:3] == ["-m", "nezha"]:
            words = ["nezha", *words[3:]]
        if words[0] == "nezha":
            path: tuple[str, ...] = ()
            for word in words[1:]:
                if path + (word,) not in tree:
                    break
                path += (word,)
            for flag in FLAG.findall(" ".join(words[1 + len(path):])):
                if flag not in tree[path]:
                    yield f"{where}: `nezha {' '.join(path)}` has no {flag}"
        elif words[0] == "python" and len(words) > 1 and words[1].startswith("bench/"):
            for flag in FLAG.findall(" ".join(words[2:])):
                if flag not in bench_flags(words[1]):
                    yield f"{where}: {words[1]} has no {flag}"
        elif code.span and words[0] not in FOREIGN_COMMANDS:
            # A flag named on its own (`--publish-ca`, `--tls-listen HOST:PORT`) or in prose
            # (`min(2, --nodes)`): whose it is the text says, so it must be some command's.
            for flag in FLAG.findall(" ".join(words)):
                if flag not in every_flag and flag not in FOREIGN_FLAGS:
                    yield f"{where}: no command takes {flag}"


def every_flag_named_anywhere(tree: dict[tuple[str, ...], set[str]]) -> set[str]:
    flags = set().union(*tree.values())
    for script in (ROOT / "bench").glob("*.py"):
        flags |= bench_flags(str(script.relative_to(ROOT)))
    return flags


def value_exists(path: str) -> bool:
    node: Any = VALUES
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def readyz_key_paths(snippet: str) -> Iterator[tuple[str, ...]]:
    """Key paths of a JSON-like snippet (`"index": {"redis": "degraded", ...}` gives ("index",) and
    ("index", "redis")), read by brace depth, so an elided `...` does not matter."""
    stack: list[str] = []
    last: str | None = None
    for m in re.finditer(r'"([^"]*)"\s*:|[{}]', snippet):
        if m.group(0) == "{":
            if last is not None:
                stack.append(last)
                last = None
        elif m.group(0) == "}":
            if stack:
                stack.pop()
        else:
            last = m.group(1)
            yield (*stack, last)


def has_path(obj: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return False
        obj = obj[key]
    return True


def readyz_snippets() -> list[Code]:
    """Code spans with JSON keys in a paragraph that speaks of `/readyz`."""
    return [c for doc in DOCS for c in code_in(doc) if c.span and "/readyz" in c.paragraph and '":' in c.text]


# -- the checks' own parts ---------------------------------------------------------------------------------

def test_key_paths_follow_nesting_and_ignore_elisions():
    assert list(readyz_key_paths('"index": {"redis": "degraded", ...}, "ready": true')) == [
        ("index",), ("index", "redis"), ("ready",)]
    assert not has_path({"index": {"redis": "ok"}}, ("index", "state"))


def test_a_flag_a_command_does_not_take_is_caught_and_one_it_takes_is_not():
    tree = parsers()
    every = every_flag_named_anywhere(tree)
    doc = ROOT / "docs" / "webhook.md"
    bad = list(flag_errors(Code(doc, "nezha webhook certs [--days 365] [--cache-ip IP]", False, ""), tree, every))
    assert bad == ["docs/webhook.md: `nezha webhook certs [--days 365] [--cache-ip IP]`: "
                   "`nezha webhook certs` has no --cache-ip"]
    assert not list(flag_errors(Code(doc, "helm upgrade --reuse-values --set a=b", False, ""), tree, every))
    assert list(flag_errors(Code(doc, "$ NEZHA_LOG_LEVEL=debug .venv/bin/nezha up --nodez 2", False, ""), tree,
                            every)) == ["docs/webhook.md: `$ NEZHA_LOG_LEVEL=debug .venv/bin/nezha up --nodez 2`: "
                                        "`nezha up` has no --nodez"]
    assert list(flag_errors(Code(doc, "--publish-ca", True, ""), tree, every)) == []
    assert list(flag_errors(Code(doc, "--publish-cert", True, ""), tree, every)) == [
        "docs/webhook.md: `--publish-cert`: no command takes --publish-cert"]


def test_the_foreign_flags_are_no_nezha_flags_and_are_still_named():
    """The allowance for other programs' flags hides no `nezha` flag, and does not outlive its use."""
    every = set().union(*parsers().values())
    assert not every & set(FOREIGN_FLAGS)
    spans = {c.text.split()[0] for doc in DOCS for c in code_in(doc) if c.span and c.text.startswith("--")}
    assert set(FOREIGN_FLAGS) <= spans


# -- the docs ---------------------------------------------------------------------------------------------

def test_every_flag_the_docs_name_is_one_its_command_takes():
    tree = parsers()
    every = every_flag_named_anywhere(tree)
    errors = [e for doc in DOCS for code in code_in(doc) for e in flag_errors(code, tree, every)]
    assert not errors, "\n".join(errors)


def test_every_chart_value_the_docs_name_exists():
    named, errors = set(), []
    for doc in DOCS:
        for code in code_in(doc):
            texts = [code.text] if code.span else re.findall(r"--set ([^\s=]+)=", code.text)
            for text in texts:
                m = VALUE_SPAN.match(text) if code.span else re.match(r"(.+)", text)
                if m is None or NOT_A_VALUE.search(m.group(1)):
                    continue
                named.add(m.group(1))
                if not value_exists(m.group(1)):
                    errors.append(f"{doc.relative_to(ROOT)}: `{code.text}` names no value of helm/nezha/values.yaml")
    # A sanity check that the walk saw spans, blocks and `--set` alike.
    assert {"cache.service.clusterIP", "https.terminate", "cache.storage.storageClass", "image.tag"} <= named
    assert not errors, "\n".join(errors)


def test_only_the_cache_nodes_readyz_is_described_key_by_key():
    """The keys below are checked against the node's /readyz; the controller's and the webhook's have
    other keys, so a snippet in their guides would need a check of its own first."""
    snippets = readyz_snippets()
    assert snippets, "no /readyz keys found in docs/: the check below would check nothing"
    assert not [c for c in snippets if c.doc.name in ("controller.md", "webhook.md")]


async def test_every_readyz_key_the_docs_name_is_in_a_real_nodes_readyz(origin, redis_server, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "node"),
         "--origin", f"www.cs.toronto.edu={origin.url}", "--redis-url", redis_server.url, "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "NEZHA_CLUSTER_TOKEN": "test-cluster-token"})
    try:
        _, body = await until_http(f"http://127.0.0.1:{port}/readyz", timeout=20, proc=proc, what="nezha cache",
                                   status=None)
    finally:
        proc.terminate()
        proc.wait(10)
    readyz = json.loads(body)
    assert "redis" in readyz["index"], readyz  # a node with an index reports it
    errors = [f"{c.doc.relative_to(ROOT)}: `{c.text}`: /readyz has no {'.'.join(path)} (it has {readyz})"
              for c in readyz_snippets() for path in readyz_key_paths(c.text) if not has_path(readyz, path)]
    assert not errors, "\n".join(errors)


# -- the connection cap: one formula, stated once, the node's ------------------------------------------------

CACHE_NODE = ROOT / "docs" / "cache-node.md"
FORMULA = re.compile(r"max_connections = (?P<cap>.+)\n\s*backlog = open_files ÷ (?P<share>\d+), "
                     r"between (?P<low>\d+) and (?P<high>\d+)\n\n\s*\(divisions rounded down, and never below "
                     r"(?P<floor>\d+)\)")


def documented_cap(open_files: int) -> int:
    m = FORMULA.search(CACHE_NODE.read_text())
    assert m, f"{CACHE_NODE.relative_to(ROOT)} no longer states the cap in the form this test reads"
    backlog = min(int(m["high"]), max(int(m["low"]), open_files // int(m["share"])))
    expression = m["cap"].replace("−", "-").replace("×", "*").replace("÷", "//")
    return max(int(m["floor"]), arithmetic(ast.parse(expression, mode="eval").body,
                                           {"open_files": open_files, "backlog": backlog}))


def arithmetic(node: ast.expr, names: dict[str, int]) -> int:
    """The value of an expression of names, integers, +, -, * and // (nothing else is evaluated)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.BinOp):
        a, b = arithmetic(node.left, names), arithmetic(node.right, names)
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else None}
        if type(node.op) in ops:
            return ops[type(node.op)]
    raise AssertionError(f"the documented formula has {ast.unparse(node)!r}, which is not arithmetic")


def test_the_documented_cap_is_the_nodes_for_any_limit():
    from cachenode.front.connections import default_max_connections, listen_backlog

    for open_files in (64, 100, 256, 1000, 1024, 4096, 8192, 20000, 65536, 1 << 20):
        assert documented_cap(open_files) == default_max_connections(open_files), open_files
    # The worked examples in the text.
    text = " ".join(CACHE_NODE.read_text().split())
    examples = re.findall(r"(?:With|with) ([\d,]+) descriptors? that is a backlog of (\d+) and a cap of ([\d,]+)|"
                          r"with ([\d,]+), a backlog of (\d+) and a cap of ([\d,]+)", text)
    assert len(examples) == 2, examples
    for example in examples:
        files, backlog, cap = (int(n.replace(",", "")) for n in filter(None, example))
        assert (listen_backlog(files), default_max_connections(files)) == (backlog, cap), example


def test_the_cap_is_stated_once_and_the_others_point_to_it():
    readers = [ROOT / "README.md", ROOT / "helm" / "nezha" / "README.md", *DOCS]
    stating = [p.relative_to(ROOT) for p in readers if re.search(r"÷ ?2", p.read_text())]
    assert stating == [CACHE_NODE.relative_to(ROOT)]
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "`docs/cache-node.md`, \"What a connection may cost\"" in operations


HANG_GUARD = 120.0  # stops a node that never listens; what the test waits for is its line


async def test_a_node_caps_connections_as_documented_for_the_limit_it_runs_with(origin, tmp_path):
    """The figure the node itself logs in node_listening, under a lowered open-files limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = 300 if hard == resource.RLIM_INFINITY else min(300, hard)

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nezha", "cache", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "n"),
        "--origin", f"www.cs.toronto.edu={origin.url}",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=lower_limit)

    async def listening_line() -> dict[str, Any]:
        # The figure is in the line the node logs once it listens: wait for that
        # line, not for a time (a node's workers start slowly on a loaded box).
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            event = json.loads(line)
            if event.get("event") == "node_listening":
                return event
        raise AssertionError(f"nezha cache exited ({await proc.wait()}) without logging node_listening")

    try:
        listening = await asyncio.wait_for(listening_line(), timeout=HANG_GUARD)
    finally:
        proc.terminate()
        await proc.wait()
    assert listening["open_files"] == limit
    assert listening["max_connections"] == documented_cap(limit)


# -- a synopsis is the command's ----------------------------------------------------------------------------

def test_the_controller_synopsis_shows_every_flag_and_brackets_exactly_the_optional_ones():
    """Required is what `nezha controller --help` marks "(required)"; every other flag is in brackets."""
    from nezha.cli import build_parser

    doc = ROOT / "docs" / "controller.md"
    (synopsis,) = [c.text for c in code_in(doc) if c.text.startswith("nezha controller ")]
    optional = set(re.findall(r"\[(--[a-z][a-z0-9-]*)", synopsis))
    required = set(FLAG.findall(re.sub(r"\[[^\]]*\]", "", synopsis)))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = [a for a in sub.choices["controller"]._actions if a.option_strings != ["-h", "--help"]]
    flag = {a: next(s for s in a.option_strings if s.startswith("--")) for a in actions}
    assert required == {flag[a] for a in actions if "(required)" in (a.help or "")}
    assert optional == {flag[a] for a in actions if "(required)" not in (a.help or "")}


# -- chart values shown whole render --------------------------------------------------------------------------

def values_blocks() -> list[tuple[Path, str]]:
    """Fenced YAML blocks whose top-level keys are all the chart's: values a reader may pass with -f."""
    out = []
    for doc in DOCS:
        for token in MarkdownIt("commonmark").parse(doc.read_text()):
            if token.type == "fence" and token.info.strip() == "yaml":
                data = yaml.safe_load(token.content)
                if isinstance(data, dict) and data and set(data) <= set(VALUES):
                    out.append((doc, token.content))
    return out


def test_every_block_of_chart_values_in_the_docs_renders(tmp_path):
    from tests.integration.chart.render import RenderError, render

    blocks = values_blocks()
    assert any(doc.name == "https.md" for doc, _ in blocks), "the Hugging Face values in docs/https.md"
    for i, (doc, text) in enumerate(blocks):
        values = tmp_path / f"{i}.yaml"
        values.write_text(text)
        try:
            render(values=[values])
        except RenderError as e:
            pytest.fail(f"{doc.relative_to(ROOT)}: a values block does not render: {e}")


# -- cross-references land ---------------------------------------------------------------------------------

REFERENCE = re.compile(r'`((?:docs/)?[\w-]+\.md|helm/nezha/README\.md|README\.md)`,? \(?"([^"]+)"')


def sections(path: Path) -> list[str]:
    """Headings, and the bold lead-ins (`**S3.**`) that open a paragraph as a heading would."""
    text = path.read_text()
    return ([m.group(1) for m in re.finditer(r"^#+ (.+)$", text, re.M)] +
            [m.group(1) for m in re.finditer(r"^\*\*([^*]+?)\.?\*\*", text, re.M)])


def test_every_section_the_docs_point_to_exists():
    """`docs/operations.md`, "Uninstall" names a file and the start of a heading in it."""
    errors, seen = [], 0
    for doc in [*DOCS, ROOT / "helm" / "nezha" / "README.md"]:
        for m in REFERENCE.finditer(" ".join(doc.read_text().split())):
            name, title = m.groups()
            target = ROOT / name if "/" in name or name == "README.md" else ROOT / "docs" / name
            seen += 1
            if not target.is_file():
                errors.append(f"{doc.relative_to(ROOT)}: {name} does not exist")
            elif not any(s.startswith(title) for s in sections(target)):
                errors.append(f"{doc.relative_to(ROOT)}: {name} has no section {title!r}")
    assert seen >= 8, "the references were not found: the pattern no longer matches how the docs write them"
    assert not errors, "\n".join(errors)


# -- module paths lead to a file ---------------------------------------------------------------------------

# docs/benchmarks.md is left out: it records measurements of past commits, which name files as they were then.
PATH_PAGES = [p for p in DOCS if p.name != "benchmarks.md"] + [ROOT / "README.md", ROOT / "helm" / "nezha" / "README.md",
                                                               ROOT / "bench" / "README.md"]
MODULE_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.py)\b")


def module_path_errors(page: Path, text: str) -> Iterator[str]:
    """Paths like `cachenode/fill/slices.py`, or `front/relay.py` and `index/schema.py` written from inside the
    package (as the guides do), that lead to no file: a module moved or renamed and the page kept its old name."""
    rooms = {p.name for p in (ROOT / "cachenode").iterdir() if p.is_dir()}
    for m in MODULE_PATH.finditer(text):
        path = m.group(1)
        first = path.split("/", 1)[0]
        candidates = [ROOT / path, page.parent / path]
        if first in rooms:
            candidates.append(ROOT / "cachenode" / path)
        if (ROOT / "nezha" / first).is_dir():
            candidates.append(ROOT / "nezha" / path)
        if not any(c.is_file() for c in candidates):
            yield f"{page.relative_to(ROOT)}: {path} is no file"


def test_a_module_path_that_leads_nowhere_is_caught_and_one_that_leads_somewhere_is_not():
    page = ROOT / "docs" / "cache-node.md"
    text = ("`front/chunked.py` once held chunks; `fill/slices.py`, `cachenode/store/disk.py`, `index/schema.py` "
            "and tests/integration/test_docs_name_what_exists.py hold what they say.")
    assert list(module_path_errors(page, text)) == ["docs/cache-node.md: front/chunked.py is no file"]


def test_every_module_path_the_docs_name_leads_to_a_file():
    errors = [e for page in PATH_PAGES for e in module_path_errors(page, page.read_text())]
    assert not errors, "\n".join(errors)
