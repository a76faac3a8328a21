"""A Hugging Face Hub double: the Hub's `resolve` endpoint for a gated repository and the CDN it
redirects large files to, as far as `huggingface_hub` and a cache in front of them depend on them.

What it mimics, checked against `huggingface_hub` 2.4's `file_download.py` and `utils/_http.py` (the
client the recipe's job runs, unmodified) and the Hub's answers described there and in its issues:

- `HEAD`/`GET /{repo}/resolve/{revision}/{file}` on the Hub. A gated repository answers 401 without a
  valid `Authorization: Bearer hf_...` and 403 to a valid token that was not granted access, both with
  `X-Error-Code: GatedRepo` (the client raises `GatedRepoError` on it). An unknown revision is 404
  `RevisionNotFound`; an unknown file 404 `EntryNotFound` with `X-Repo-Commit`.
- A file stored with Git LFS (the model's weights): `302` to a signed URL on the CDN host, carrying
  `X-Repo-Commit`, `X-Linked-Etag` (the LFS object's sha256, quoted) and `X-Linked-Size`. The client
  reads its metadata from this answer (it follows no redirect to another host on a `HEAD`) and then GETs
  the `Location` itself without the token.
- A small file kept in git (`config.json`): a relative `307` to `/api/resolve-cache/models/{repo}/
  {commit}/{file}`, which the client follows on the Hub with the token, as the Hub has answered since
  2025. There: `200` with `ETag` (the git blob id), `X-Repo-Commit` and the body.
- The CDN (CloudFront, `cdn-lfs*.hf.co`): a URL signed for one path until `Expires`, with `Policy`,
  `Signature` and `Key-Pair-Id`; an unsigned, altered or expired URL is `403 AccessDenied`. Objects have a
  strong `ETag` (the sha256); `If-None-Match` and `Range` are answered as RFC 9110 says, the signature
  checked first, as CloudFront does.

- The listing endpoints a prefetch reads (controller/expand.py), as `huggingface_hub`'s `HfApi` reads
  them: `GET /api/{models|datasets}/{repo}/revision/{rev}` (the repository's info at a revision: `sha`
  is its commit, `siblings` its files) and `GET /api/{models|datasets}/{repo}/tree/{rev}` (one level, or
  every file with `recursive=true`: `type`, `path`, `size`, `oid`, and `lfs` for LFS files), in pages of
  `Repo.tree_page` entries linked by `Link: <https://huggingface.co/...&cursor=...>; rel="next"`. The
  Hub names its own public host in that link, not the address it was reached at.
- Access (`Repo.access`): `gated` (the default) lists its files to anyone, as the Hub shows a gated
  repository's file list, and gates every `resolve`; `public` answers everyone; `private` answers only
  a granted token and is `401 RepoNotFound` to everyone else, as if it did not exist.
- A dataset repository (`Repo.kind = "dataset"`) is served under `/datasets/{repo}/resolve/...` and
  `/api/datasets/...`, a model's under `/{repo}/resolve/...` and `/api/models/...`.

Every conditional and ranged request of the Hub is checked for the token before it is answered, which is
what `credentials: authorize` needs of an origin (docs/private-objects.md, "Limits today"). Not
mimicked: Xet storage (no `X-Xet-Hash`: the job runs with HF_HUB_DISABLE_XET=1 anyway), the other `/api`
endpoints, uploads.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import AsyncIterator
from urllib.parse import quote, urlencode

from aiohttp import web

KEY_PAIR_ID = "K3NEZHAHUBDOUBLE"


@dataclass
class Repo:
    """A gated model repository at one commit: files kept in git, and files kept in LFS."""

    name: str
    commit: str
    git_files: dict[str, bytes]
    lfs_files: dict[str, bytes]
    granted: set[str] = field(default_factory=set)  # tokens that accepted the conditions
    access: str = "gated"  # gated, public or private
    kind: str = "model"  # model or dataset
    tree_page: int = 1000  # entries per page of the tree API

    @property
    def kinds(self) -> str:
        return "datasets" if self.kind == "dataset" else "models"

    @property
    def files(self) -> dict[str, bytes]:
        return {**self.git_files, **self.lfs_files}


def _quoted(tag: str) -> str:
    return f'"{tag}"'


def _ranged_or_whole(request: web.Request, body: bytes, fields: dict[str, str]) -> web.Response:
    """RFC 9110: If-None-Match (a 304 when the tag matches), then a single byte range, else the body."""
    if request.headers.get("If-None-Match") == fields["ETag"]:
        return web.Response(status=304, headers=fields)
    wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
    if wanted and int(wanted.group(1)) < len(body):
        start = int(wanted.group(1))
        end = min(int(wanted.group(2) or len(body) - 1), len(body) - 1)
        return web.Response(status=206, body=body[start:end + 1], headers={
            **fields, "Content-Range": f"bytes {start}-{end}/{len(body)}"})
    return web.Response(body=body, headers=fields)


class HubDouble:
    """The Hub (`hub_app`) and its CDN (`cdn_app`), each served by the test where it likes.

    `cdn_url` is where the Hub's redirects point (`https://cdn-lfs.hf.co`: the name the job's pod aliases to
    the cache). `sent` counts the object bytes each side sent (bodies of 200 and 206 answers), `answers`
    the statuses by (side, method, path without query)."""

    def __init__(self, repo: Repo, *, cdn_url: str = "https://cdn-lfs.hf.co", lifetime: int = 3600,
                 public_host: str = "huggingface.co") -> None:
        self.repo = repo
        self.public_host = public_host
        self.cdn_url = cdn_url
        self.lifetime = lifetime
        self._secret = b"nezha-hub-double-signing-key"
        self.sent: Counter[str] = Counter()
        self.answers: Counter[tuple[str, str, str, int]] = Counter()
        self.authorizations: list[str | None] = []

    # -- the Hub -------------------------------------------------------------

    def hub_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/datasets/{org}/{name}/resolve/{revision}/{file:.+}",
                             self._counted("hub", self._resolve))
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{file:.+}", self._counted("hub", self._resolve))
        app.router.add_route("*", "/api/resolve-cache/{kinds}/{org}/{name}/{commit}/{file:.+}",
                             self._counted("hub", self._resolve_cache))
        app.router.add_get("/api/{kinds}/{org}/{name}/revision/{revision}", self._counted("hub", self._revision))
        app.router.add_get("/api/{kinds}/{org}/{name}/tree/{revision}", self._counted("hub", self._tree))
        return app

    def _kinds_of(self, request: web.Request) -> str:
        """The repository type a path names: `datasets`, or `models` (a resolve URL without a prefix)."""
        kinds = request.match_info.get("kinds")
        if kinds is not None:
            return kinds
        return "datasets" if request.path.startswith("/datasets/") else "models"

    def _missing(self, request: web.Request) -> web.Response | None:
        """404 RepoNotFound for another repository or type; a private one is not found without its token."""
        info = request.match_info
        if f"{info['org']}/{info['name']}" != self.repo.name or self._kinds_of(request) != self.repo.kinds:
            return web.Response(status=404, text="Repository not found\n", headers={"X-Error-Code": "RepoNotFound"})
        if self.repo.access == "private":
            auth = request.headers.get("Authorization", "")
            self.authorizations.append(auth or None)
            if auth.removeprefix("Bearer ") not in self.repo.granted:
                return web.Response(status=401, text="Repository not found\n", headers={
                    "X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository Not Found for url"})
        return None

    def _commit_of(self, revision: str) -> str | None:
        return self.repo.commit if revision in ("main", self.repo.commit) else None

    def _revision(self, request: web.Request) -> web.Response:
        missing = self._missing(request)
        if missing is not None:
            return missing
        commit = self._commit_of(request.match_info["revision"])
        if commit is None:
            return web.Response(status=404, text="Invalid rev id\n", headers={"X-Error-Code": "RevisionNotFound"})
        return web.json_response({"id": self.repo.name, "sha": commit, "private": self.repo.access == "private",
                                  "gated": "auto" if self.repo.access == "gated" else False,
                                  "siblings": [{"rfilename": f} for f in sorted(self.repo.files)]})

    def _tree(self, request: web.Request) -> web.Response:
        missing = self._missing(request)
        if missing is not None:
            return missing
        info = request.match_info
        if self._commit_of(info["revision"]) is None:
            return web.Response(status=404, text="Invalid rev id\n", headers={"X-Error-Code": "RevisionNotFound"})
        recursive = request.query.get("recursive", "").lower() in ("true", "1")
        entries, folders = [], set()
        for path in sorted(self.repo.files):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                folders.add("/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                entries.append(self._tree_entry(path))
        entries += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f}
                    for f in sorted(folders) if recursive or "/" not in f]
        entries.sort(key=lambda e: e["path"])
        start = int(base64.urlsafe_b64decode(request.query["cursor"]).decode()) if "cursor" in request.query else 0
        page = entries[start:start + self.repo.tree_page]
        headers = {}
        if start + self.repo.tree_page < len(entries):
            cursor = base64.urlsafe_b64encode(str(start + self.repo.tree_page).encode()).decode()
            headers["Link"] = (f"<https://{self.public_host}{request.path}?recursive={str(recursive).lower()}"
                               f"&cursor={cursor}>; rel=\"next\"")
        return web.Response(text=json.dumps(page), content_type="application/json", headers=headers)

    def _tree_entry(self, path: str) -> dict:
        if path in self.repo.lfs_files:
            body = self.repo.lfs_files[path]
            return {"type": "file", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": len(body), "path": path,
                    "lfs": {"oid": hashlib.sha256(body).hexdigest(), "size": len(body), "pointerSize": 134}}
        return {"type": "file", "oid": self._blob_id(path), "size": len(self.repo.git_files[path]), "path": path}

    def _counted(self, side: str, answer):
        """An aiohttp handler giving `answer`'s response, counted in `answers` and `sent`."""
        async def handle(request: web.Request) -> web.Response:
            response = answer(request)
            self.answers[(side, request.method, request.path, response.status)] += 1
            if request.method == "GET" and response.status in (200, 206):
                self.sent[side] += len(response.body or b"")
            return response

        return handle

    def _refusal(self, request: web.Request) -> web.Response | None:
        """401 without a valid token, 403 for one not granted: the gate comes before anything else.
        A public repository has no gate; a private one's is `_missing`."""
        if self.repo.access != "gated":
            return None
        auth = request.headers.get("Authorization", "")
        self.authorizations.append(auth or None)
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer hf_") else None
        if token is None:
            return web.Response(status=401, text="Invalid credentials in Authorization header\n", headers={
                "X-Error-Code": "GatedRepo", "X-Error-Message":
                    f"Access to model {self.repo.name} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."})
        if token not in self.repo.granted:
            return web.Response(status=403, text="Access to this gated model is not granted\n", headers={
                "X-Error-Code": "GatedRepo", "X-Error-Message":
                    f"Access to model {self.repo.name} is restricted and you are not in the authorized list."})
        return None

    def _resolve(self, request: web.Request) -> web.Response:
        info = request.match_info
        missing = self._missing(request)
        if missing is not None:
            return missing
        refused = self._refusal(request)
        if refused is not None:
            return refused
        if info["revision"] not in ("main", self.repo.commit):
            return web.Response(status=404, text="Invalid rev id\n", headers={"X-Error-Code": "RevisionNotFound"})
        file, commit = info["file"], {"X-Repo-Commit": self.repo.commit}
        if file in self.repo.lfs_files:
            body = self.repo.lfs_files[file]
            oid = hashlib.sha256(body).hexdigest()
            return web.Response(status=302, text=f"Found. Redirecting to {self.signed(oid, file)}", headers={
                **commit, "Location": self.signed(oid, file), "ETag": _quoted(oid),
                "X-Linked-Etag": _quoted(oid), "X-Linked-Size": str(len(body))})
        if file in self.repo.git_files:
            return web.Response(status=307, headers={**commit, "Location": (
                f"/api/resolve-cache/{self.repo.kinds}/{self.repo.name}/{self.repo.commit}/{quote(file)}?"
                + urlencode({"etag": _quoted(self._blob_id(file))}))})
        return web.Response(status=404, text="Entry not found\n", headers={**commit, "X-Error-Code": "EntryNotFound"})

    def _resolve_cache(self, request: web.Request) -> web.Response:
        info = request.match_info
        file = info["file"]
        missing = self._missing(request)
        if missing is not None:
            return missing
        if info["commit"] != self.repo.commit or file not in self.repo.git_files:
            return web.Response(status=404, text="Entry not found\n", headers={"X-Error-Code": "EntryNotFound"})
        return self._refusal(request) or _ranged_or_whole(request, self.repo.git_files[file], {
            "ETag": _quoted(self._blob_id(file)), "X-Repo-Commit": self.repo.commit,
            "Content-Type": "text/plain; charset=utf-8"})

    def _blob_id(self, file: str) -> str:
        body = self.repo.git_files[file]
        return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()

    # -- the CDN -------------------------------------------------------------

    def cdn_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/repos/{a}/{b}/{oid}", self._counted("cdn", self._cdn))
        return app

    def _signature(self, path: str, expires: str) -> str:
        return hmac.new(self._secret, f"{path}\n{expires}\n{KEY_PAIR_ID}".encode(), hashlib.sha256).hexdigest()

    def signed(self, oid: str, file: str) -> str:
        """The CDN URL the Hub redirects to: one object, signed until `lifetime` from now."""
        path = f"/repos/{oid[:2]}/{oid[2:4]}/{oid}"
        expires = str(int(time.time()) + self.lifetime)
        # Spelt as the Hub spells it: `*` bare, the quotes of RFC 8187's `filename*` as %27.
        disposition = (f"inline%3B+filename*%3DUTF-8%27%27{quote(file)}%3B+filename%3D%22{quote(file)}%22%3B")
        return f"{self.cdn_url}{path}?response-content-disposition={disposition}&" + urlencode({
            "Expires": expires, "Policy": "eyJTdGF0ZW1lbnQiOlt7IlJlc291cmNlIjoiaHR0cHM6Ly9jZG4tbGZzLmhmLmNvLyoifV19",
            "Signature": self._signature(path, expires), "Key-Pair-Id": KEY_PAIR_ID})

    def _cdn(self, request: web.Request) -> web.Response:
        q = request.query
        expires, signature = q.get("Expires", ""), q.get("Signature", "")
        denied = web.Response(status=403, content_type="text/xml", text=(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>"
            "<Message>Access denied</Message></Error>"))
        if q.get("Key-Pair-Id") != KEY_PAIR_ID or not expires.isdigit() or int(expires) < time.time() \
                or not hmac.compare_digest(signature, self._signature(request.path, expires)):
            return denied
        oid = request.match_info["oid"]
        body = next((b for b in self.repo.lfs_files.values() if hashlib.sha256(b).hexdigest() == oid), None)
        if body is None:
            return denied  # CloudFront in front of a private bucket: a missing key is a refusal too
        return _ranged_or_whole(request, body, {"ETag": _quoted(oid), "Accept-Ranges": "bytes",
                                                "Content-Type": "binary/octet-stream",
                                                "Content-Disposition": q.get("response-content-disposition", "")})


@contextlib.asynccontextmanager
async def served(double: HubDouble, *, hub_address: str = "127.0.0.7",
                 cdn_address: str = "127.0.0.8") -> AsyncIterator[HubDouble]:
    """The Hub and its CDN each on a loopback address of its own, on a free port: `double.hub_url` and
    `double.cdn_stand_in` say where (the redirects still name the CDN by its public name)."""
    runners = []
    try:
        urls = []
        for app, address in ((double.hub_app(), hub_address), (double.cdn_app(), cdn_address)):
            runner = web.AppRunner(app, access_log=None)
            runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, address, 0)
            await site.start()
            urls.append(f"http://{address}:{site._server.sockets[0].getsockname()[1]}")
        double.hub_url, double.cdn_stand_in = urls
        yield double
    finally:
        for runner in runners:
            await runner.cleanup()
