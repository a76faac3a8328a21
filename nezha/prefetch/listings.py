"""The listings a prefetch name expands through, read and addressed. Pure: no I/O.

The controller's I/O edge (controller/expand.py) asks; this module says what
to ask and reads the answers:

- the Hub: `GET /api/{models|datasets}/{repo}/revision/{rev}` gives the
  commit a revision is at (`sha`), read once, so the set of files is fixed
  even when the branch moves during the prefetch; then the tree API at that
  commit (`/tree/{commit}?recursive=true`, pages linked by `Link: <...>;
  rel="next"`) lists the files; each is fetched by its `resolve` URL, as
  `huggingface_hub` fetches it (the Hub answers it with a redirect the
  controller follows: controller/prefetch.py);
- S3: ListObjectsV2 (`GET /{bucket}?list-type=2&prefix=...`), path-style,
  page after page by `NextContinuationToken`; each key is addressed
  path-style and percent-encoded as botocore does, so the key the node
  stores is the one a boto3 client's read asks for;
- a manifest: one URL per line, blank lines and `#` comments skipped, a
  relative URL read against the manifest's own;
- an index page: every link to a file under the folder (not to a
  subfolder, a parent or a sort order), read against the page's URL.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from urllib.parse import quote, urlencode, urljoin, urlsplit

from nezha.prefetch.names import HubRepo

S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class BadListing(ValueError):
    """An answer that is not the listing it should be; the message names what was wrong."""


# -- the Hub ------------------------------------------------------------------

def hub_revision_path(name: HubRepo) -> str:
    return f"/api/{name.kind}/{name.repo}/revision/{quote(name.revision, safe='')}"


def hub_commit(body: str) -> str:
    """The commit (`sha`) of the Hub's revision answer."""
    try:
        sha = json.loads(body).get("sha")
    except (ValueError, AttributeError) as e:
        raise BadListing(f"the Hub's revision answer is not a JSON object: {e}") from e
    if not isinstance(sha, str) or not sha:
        raise BadListing("the Hub's revision answer has no sha")
    return sha


def hub_tree_path(name: HubRepo, commit: str) -> str:
    return f"/api/{name.kind}/{name.repo}/tree/{quote(commit, safe='')}?recursive=true"


def hub_files(body: str) -> list[str]:
    """The file paths of one page of the tree API (directories left out: recursive lists their files)."""
    try:
        entries = json.loads(body)
    except ValueError as e:
        raise BadListing(f"the Hub's tree answer is not JSON: {e}") from e
    if not isinstance(entries, list):
        raise BadListing("the Hub's tree answer is not a list")
    return [e["path"] for e in entries if isinstance(e, dict) and e.get("type") == "file"
            and isinstance(e.get("path"), str)]


def next_link(link: str | None) -> str | None:
    """The `rel="next"` target of an RFC 8288 `Link` field, if any."""
    for part in (link or "").split(","):
        target, _, params = part.strip().partition(";")
        if target.startswith("<") and target.endswith(">") and any(
                p.strip().replace(" ", "") in ('rel="next"', "rel=next") for p in params.split(";")):
            return target[1:-1]
    return None


def hub_resolve_url(host: str, name: HubRepo, commit: str, path: str) -> str:
    """The `resolve` URL of one file at `commit`, spelt as `huggingface_hub`'s `hf_hub_url` spells it."""
    prefix = "datasets/" if name.dataset else ""
    return f"https://{host}/{prefix}{name.repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


# -- S3 -----------------------------------------------------------------------

def s3_list_query(prefix: str, token: str | None = None, max_keys: int | None = None) -> str:
    """ListObjectsV2's query, parameters sorted (as SigV4's canonical query wants them); `max_keys`
    unset leaves the page size to the server (1000 on S3)."""
    params = {"list-type": "2", "prefix": prefix}
    if max_keys is not None:
        params["max-keys"] = str(max_keys)
    if token:
        params["continuation-token"] = token
    return urlencode(sorted(params.items()), quote_via=quote, safe="-_.~")


def s3_listing(body: str) -> tuple[list[str], str | None]:
    """The keys of one ListObjectsV2 page (folder markers ending in / left out) and the next page's token."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as e:
        raise BadListing(f"the S3 listing is not XML: {e}") from e
    if root.tag not in (f"{S3_NS}ListBucketResult", "ListBucketResult"):
        raise BadListing(f"the S3 listing is a {root.tag.removeprefix(S3_NS)}, not a ListBucketResult")

    def find(element, tag: str):
        found = element.find(S3_NS + tag)
        return found if found is not None else element.find(tag)

    keys = []
    for item in list(root.iter(S3_NS + "Contents")) + list(root.iter("Contents")):
        key = find(item, "Key")
        if key is not None and key.text and not key.text.endswith("/"):
            keys.append(key.text)
    truncated = find(root, "IsTruncated")
    token = find(root, "NextContinuationToken")
    if truncated is not None and (truncated.text or "").strip() == "true":
        if token is None or not token.text:
            raise BadListing("the S3 listing is truncated but names no NextContinuationToken")
        return keys, token.text
    return keys, None


def s3_object_url(host: str, bucket: str, key: str) -> str:
    """A key's path-style https URL, percent-encoded as botocore encodes it (safe: / and ~)."""
    return f"https://{host}/{bucket}/{quote(key, safe='/~')}"


# -- manifests and index pages ------------------------------------------------

def manifest_urls(body: str, base: str) -> list[str]:
    """The URLs of a manifest, one per line, in order, each once."""
    urls = []
    for line in body.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            urls.append(urljoin(base, line))
    return list(dict.fromkeys(urls))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def index_urls(body: str, base: str) -> list[str]:
    """The files an index page links to under its own folder, in order, each once."""
    parser = _Links()
    parser.feed(body)
    folder = urlsplit(base)
    urls = []
    for href in parser.hrefs:
        url = urljoin(base, href)
        parts = urlsplit(url)
        if (parts.scheme, parts.netloc) != (folder.scheme, folder.netloc) or parts.query or parts.fragment:
            continue
        if not parts.path.startswith(folder.path) or parts.path == folder.path or parts.path.endswith("/"):
            continue
        urls.append(url)
    return list(dict.fromkeys(urls))


# -- hosts --------------------------------------------------------------------

def hosts_outside(urls: Iterable[str], allowed: Callable[[str], bool]) -> list[str]:
    """The hosts among `urls` that `allowed` refuses (not in the origin table), sorted, each once;
    a URL that is no http(s) URL with a host counts by its text."""
    outside = set()
    for url in urls:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        if parts.scheme not in ("http", "https") or not host:
            outside.add(url)
        elif not allowed(host):
            outside.add(host)
    return sorted(outside)
