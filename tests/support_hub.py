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

Every conditional and ranged request of the Hub is checked for the token before it is answered, which is
what `credentials: authorize` needs of an origin (docs/private-objects.md, "Limits today"). Not
mimicked: Xet storage (no `X-Xet-Hash`: the job runs with HF_HUB_DISABLE_XET=1 anyway), the `/api`
listing endpoints, uploads.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections import Counter
from dataclasses import dataclass, field
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

    def __init__(self, repo: Repo, *, cdn_url: str = "https://cdn-lfs.hf.co", lifetime: int = 3600) -> None:
        self.repo = repo
        self.cdn_url = cdn_url
        self.lifetime = lifetime
        self._secret = b"nezha-hub-double-signing-key"
        self.sent: Counter[str] = Counter()
        self.answers: Counter[tuple[str, str, str, int]] = Counter()
        self.authorizations: list[str | None] = []

    # -- the Hub -------------------------------------------------------------

    def hub_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{file:.+}", self._counted("hub", self._resolve))
        app.router.add_route("*", "/api/resolve-cache/models/{org}/{name}/{commit}/{file:.+}",
                             self._counted("hub", self._resolve_cache))
        return app

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
        """401 without a valid token, 403 for one not granted: the gate comes before anything else."""
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
        if f"{info['org']}/{info['name']}" != self.repo.name:
            return web.Response(status=404, text="Repository not found\n",
                                headers={"X-Error-Code": "RepoNotFound"})
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
                f"/api/resolve-cache/models/{self.repo.name}/{self.repo.commit}/{file}?"
                + urlencode({"etag": _quoted(self._blob_id(file))}))})
        return web.Response(status=404, text="Entry not found\n", headers={**commit, "X-Error-Code": "EntryNotFound"})

    def _resolve_cache(self, request: web.Request) -> web.Response:
        info = request.match_info
        file = info["file"]
        if f"{info['org']}/{info['name']}" != self.repo.name or info["commit"] != self.repo.commit \
                or file not in self.repo.git_files:
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
