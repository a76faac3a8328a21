"""What one entry of `nezha.io/prefetch` names. Pure: no I/O.

Users name data the way their tools do, not by object URL: a model
repository (`hf://ORG/REPO[@REV]`), a dataset on the Hub
(`hf://datasets/ORG/NAME[@REV]`), a bucket prefix (`s3://BUCKET/PREFIX`),
a web folder (`https://HOST/PATH/`, its index page) or a manifest
(`https://HOST/PATH/files.txt`, one URL per line). Each is parsed here into
a value the controller expands (controller/expand.py) into object URLs;
anything else that is an http(s) URL is one object, as before.

A manifest is recognised by its file name: the last path segment ends in
`files.txt` (`files.txt`, `train-files.txt`, `imagenet.files.txt`). Any
other `.txt` URL is an object of its own, so a text file can still be
prefetched as itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

REVISION_DEFAULT = "main"
MANIFEST_SUFFIX = "files.txt"

# The Hub's own rules for a repository id: ORG/NAME, each [\w.-], no "--" or "..".
_HUB_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# A revision: a branch, tag or commit; no whitespace, no "..", no leading "/".
_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
# S3 bucket names (the rules every S3 API shares): 3-63 of a-z 0-9 . -
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class BadName(ValueError):
    """An entry that names nothing the controller can expand; the message says why."""


@dataclass(frozen=True)
class ObjectUrl:
    """One object, by its http(s) URL."""

    url: str


@dataclass(frozen=True)
class HubRepo:
    """A repository on the Hugging Face Hub at a revision (a branch, tag or commit)."""

    repo: str  # ORG/NAME
    revision: str = REVISION_DEFAULT
    dataset: bool = False

    @property
    def kind(self) -> str:
        """The Hub API's plural for the repository type: the path segment of its endpoints."""
        return "datasets" if self.dataset else "models"


@dataclass(frozen=True)
class S3Prefix:
    """Every object of a bucket whose key starts with `prefix` (empty: the whole bucket)."""

    bucket: str
    prefix: str


@dataclass(frozen=True)
class Listing:
    """A web folder's index page (`manifest` False) or a manifest of one URL per line."""

    url: str
    manifest: bool


Name = ObjectUrl | HubRepo | S3Prefix | Listing


def parse_name(text: str) -> Name:
    """The name `text` (one entry, stripped) stands for; BadName says what is wrong with it."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise BadName("is not a URL, an hf:// or an s3:// name")
    scheme = scheme.lower()
    if scheme == "hf":
        return _hub(rest)
    if scheme == "s3":
        return _s3(rest)
    if scheme in ("http", "https"):
        path = urlsplit(text).path
        if path.endswith("/"):
            return Listing(text, manifest=False)
        if path.rsplit("/", 1)[-1].endswith(MANIFEST_SUFFIX):
            return Listing(text, manifest=True)
        return ObjectUrl(text)
    raise BadName(f"has the scheme {scheme}://, not http://, https://, hf:// or s3://")


def _hub(rest: str) -> HubRepo:
    repo, at, revision = rest.partition("@")
    if at and not revision:
        raise BadName("has an empty revision after @")
    revision = revision or REVISION_DEFAULT
    if ".." in revision or revision.startswith("/") or not _REVISION.match(revision):
        raise BadName(f"has the revision {revision!r}, which is no branch, tag or commit")
    parts = repo.strip("/").split("/")
    dataset = parts[0] == "datasets"
    if dataset:
        parts = parts[1:]
    if parts and parts[0] in ("models", "spaces"):
        raise BadName(f"names {parts[0]}/: write hf://ORG/REPO for a model; spaces are not prefetched")
    if len(parts) != 2 or not all(_HUB_PART.match(p) and ".." not in p and "--" not in p for p in parts):
        shape = "hf://datasets/ORG/NAME[@REV]" if dataset else "hf://ORG/REPO[@REV]"
        raise BadName(f"is not of the form {shape}")
    return HubRepo("/".join(parts), revision, dataset)


def _s3(rest: str) -> S3Prefix:
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise BadName(f"has the bucket {bucket!r}, which is no S3 bucket name")
    if any(c in prefix for c in "\r\n\x00"):
        raise BadName("has a control character in its prefix")
    return S3Prefix(bucket, prefix)
