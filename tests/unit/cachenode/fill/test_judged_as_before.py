"""A cold fill judges every answer as the judging did before it was made
faster (issue 35: names read once per set of names, quick frozen
dataclasses, stored lines remembered per names): `judged_as_before.json`
holds what main's `judge` and `Digests.expected` made of each answer below,
each way below, recorded from main before the change (regenerate with
`python tests/unit/cachenode/fill/test_judged_as_before.py > ...json` on
a checkout whose judging is to be the reference). Each answer is judged
with what its names tell worked out afresh and, again, remembered from
the answers before it: both must give the recorded figures."""

import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from cachenode.fill.flights import Source
from cachenode.fill.judged import judge
from cachenode.fill.origin import fields_of
from cachenode.fill.verify import Digests
from nezha.keys import Target
from nezha.origins import Origin
from nezha.ring import Peer

NOW = 1_795_836_011.5
DATE = "Sun, 29 Nov 2026 03:20:11 GMT"
LM = "Sun, 29 Nov 2026 02:58:40 GMT"
NGINX = [("Server", "nginx/1.22.1"), ("Date", DATE), ("Content-Type", "application/octet-stream"),
         ("Content-Length", "16384"), ("Last-Modified", LM), ("Connection", "keep-alive"),
         ("ETag", '"6a6b2d40-4000"'), ("Accept-Ranges", "bytes")]
S3 = [("x-amz-id-2", "abc"), ("x-amz-request-id", "R1"), ("Date", DATE), ("Last-Modified", LM),
      ("ETag", '"5d41402abc4b2a76b9719d911017c592"'), ("Accept-Ranges", "bytes"),
      ("Content-Type", "binary/octet-stream"), ("Server", "AmazonS3"), ("Content-Length", "5")]


def with_(pairs, *more, drop=()):
    return [p for p in pairs if p[0] not in drop] + list(more)


ANSWERS = [
    (200, NGINX),
    (200, with_(NGINX, ("Date", DATE), drop=("Date",))),  # the same names, Date moved last
    (200, with_(NGINX, ("Connection", "close, X-Hop"), ("X-Hop", "1"), drop=("Connection",))),
    (200, [(n, "close" if n == "Connection" else v) for n, v in NGINX]),  # nginx's names, another Connection
    (200, [(n, "keep-alive, Server" if n == "Connection" else v) for n, v in NGINX]),  # one that drops a line
    (200, [(n, "Mon, 30 Nov 2026 00:00:00 GMT" if n == "Date" else v) for n, v in NGINX]),
    (200, with_(NGINX, ("Cache-Control", "no-store"))),
    (200, with_(NGINX, ("Cache-Control", "no-store, must-understand, max-age=60"))),
    (200, with_(NGINX, ("Cache-Control", "private"))),
    (200, with_(NGINX, ("Cache-Control", 'private="set-cookie", max-age=60'))),
    (200, with_(NGINX, ("Cache-Control", "public, max-age=60, stale-while-revalidate=30, stale-if-error=600"))),
    (200, with_(NGINX, ("Cache-Control", "s-maxage=120, max-age=10"))),
    (200, with_(NGINX, ("Cache-Control", "max-age=-1"))),
    (200, with_(NGINX, ("cache-control", "no-cache"), ("Cache-Control", "max-age=60"))),
    (200, with_(NGINX, ("Cache-Control", "must-revalidate, max-age=600"), ("Age", "100"))),
    (200, with_(NGINX, ("Expires", "Sun, 29 Nov 2026 04:20:11 GMT"))),
    (200, with_(NGINX, ("Expires", "0"))),
    (200, with_(NGINX, ("Expires", "Sun, 29 Nov 2026 04:20:11 GMT"), ("Cache-Control", "max-age=5"))),
    (200, with_(NGINX, ("Vary", "Accept-Encoding"))),
    (200, with_(NGINX, ("Vary", "accept-encoding, Origin"), ("vary", "Accept"))),
    (200, with_(NGINX, ("Vary", "*"))),
    (200, with_(NGINX, ("Vary", "Accept, a b"))),
    (200, with_(NGINX, ("Vary", "Authorization"), ("Cache-Control", "private, max-age=60"))),
    (200, with_(NGINX, ("Set-Cookie", "a=b"))),
    (200, with_(NGINX, ("Age", "100"))),
    (200, with_(NGINX, ("Age", "7, 9"), ("Age", "11"))),
    (200, with_(NGINX, ("Age", "soon"))),
    (200, with_(NGINX, ("Age", "99999999999999"))),
    (200, with_(NGINX, drop=("Last-Modified",))),
    (200, with_(NGINX, drop=("Last-Modified", "ETag"))),
    (200, with_(NGINX, drop=("Date",))),
    (200, with_(NGINX, ("Date", "Sun, 29 Nov 2026 03:20:11 UTC"), drop=("Date",))),
    (200, with_(NGINX, ("Last-Modified", "Sunday, 29-Nov-26 02:58:40 GMT"), drop=("Last-Modified",))),
    (200, with_(NGINX, ("Last-Modified", "Sun Nov  1 02:58:40 2026"), drop=("Last-Modified",))),
    (200, with_(NGINX, ("Last-Modified", "yesterday"), drop=("Last-Modified",))),
    (200, with_(NGINX, ("CDN-Cache-Control", "max-age=600"), ("Cache-Control", "private"), ("Expires", "0"))),
    (200, with_(NGINX, ("Nezha-Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=600"))),
    (200, with_(NGINX, ("CDN-Cache-Control", "max-age=\"60\""))),
    (200, with_(NGINX, ("CDN-Cache-Control", "not a dictionary;;"), ("Cache-Control", "max-age=30"))),
    (200, with_(NGINX, ("X-Nezha-Cache", "hit"), ("X-Nezha-Expires", "1"), ("Proxy-Authenticate", "Basic"),
                ("Keep-Alive", "timeout=5"), ("Transfer-Encoding", "chunked"))),
    (200, with_(NGINX, ("Content-Length", "2000000"), drop=("Content-Length",))),
    (200, with_(NGINX, ("X-Big", "x" * 70_000))),
    (200, with_(S3, ("x-amz-checksum-crc32", "NhCmhg=="))),
    (200, with_(S3, ("x-amz-checksum-crc32c", "AAAAAA==-3"), ("x-amz-checksum-type", "COMPOSITE"))),
    (200, with_(S3, ("x-amz-checksum-sha512", "AAAA"))),
    (200, with_(S3, ("Content-MD5", "XUFAKrxLKna5cZ2REBfFkg=="))),
    (200, with_(S3, ("Content-MD5", "not base64"))),
    (200, with_(S3, ("Content-Digest", "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:"))),
    (200, with_(S3, ("Content-Digest", "sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:"),
                ("Content-Encoding", "gzip"))),
    (200, with_(S3, ("Repr-Digest", "sha-512=:AAAA:, sha-256=:LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=:"))),
    (200, with_(S3, ("X-Goog-Hash", "crc32c=AAAAAA==, md5=XUFAKrxLKna5cZ2REBfFkg=="))),
    (206, with_(NGINX, ("Content-Range", "bytes 0-99/16384"), ("Content-Digest", "sha-256=:AAAA:"))),
    (404, with_(NGINX, drop=("ETag",))),
    (404, [("Date", DATE), ("Content-Length", "0")]),
    (301, with_(NGINX, ("Location", "/elsewhere"), ("X-Linked-ETag", '"' + "a" * 64 + '"'))),
    (304, [("Date", DATE), ("ETag", '"6a6b2d40-4000"'), ("Cache-Control", "max-age=60")]),
    (500, [("Date", DATE), ("Content-Length", "0")]),
    (503, with_(NGINX, ("Cache-Control", "max-age=60"))),
    (200, []),
]

# (name, origin's fields, from a peer, stale copy held, fits up to)
WAYS = [
    ("origin", {}, False, None, 1_000_000),
    ("policy ttl", {"default_ttl": 300.0}, False, None, 1_000_000),
    ("authorize", {"credentials": "authorize"}, False, None, 1_000_000),
    ("one targeted", {"targeted_cache_control": ("CDN-Cache-Control",)}, False, None, 1_000_000),
    ("peer", {}, True, None, 1_000_000),
    ("stale", {}, False, (NOW - 10, 60.0), 1_000_000),
]


class Counter:
    def labels(self, **_labels):
        return self

    def inc(self):
        pass


def judged_rows(before_each=lambda: None):
    """Every answer judged every way, `before_each` called before each: the
    figures of each Judged and expected digest, as JSON spells them."""
    target = Target("http", "origin.test", "/f/1", "")
    rows = []
    for way, fields, peer, stale, capacity in WAYS:
        origin = Origin(host="origin.test", upstream="http://127.0.0.1:8080", **fields)
        source = Source(url="http://127.0.0.1:8080/f/1", what="origin", headers={},
                        peer=Peer("n2", "127.0.0.1:9") if peer else None)
        held = None if stale is None else SimpleNamespace(expires_at=stale[0], stale_if_error=stale[1])
        digests = Digests(mismatches=Counter())
        for status, pairs in ANSWERS:
            before_each()
            headers = CIMultiDictProxy(CIMultiDict(pairs))
            length = headers.get("Content-Length")
            response = SimpleNamespace(status=status, headers=headers,
                                       content_length=None if length is None else int(length))
            digests.noted(target, status, headers)
            j = judge(response, origin=origin, source=source, stale=held, now=NOW,
                      fits=lambda n: n <= capacity,
                      chunking=lambda vary, authorize: (None, 0))
            p = j.policy
            expected = digests.expected(key="k", target=target, status=status, headers=fields_of(response))
            kept = [list(pair) for pair in j.kept]
            if len(repr(kept)) > 2000:  # the 70 KB field: its digest, not itself
                kept = ["sha256", hashlib.sha256(repr(kept).encode()).hexdigest()]
            rows.append([way, status, j.now, j.authorize, p.storable, p.reason, p.ttl, p.stale_if_error,
                         p.stale_while_revalidate, p.heuristic, j.expires_at, kept,
                         None if j.vary is None else list(j.vary), j.chunk_size, j.length, j.age,
                         j.decision.step.value, j.decision.reason,
                         None if expected is None else [expected.algorithm.value, expected.value.hex(), expected.field]])
    return json.loads(json.dumps(rows))  # as read back from the file: lists, not tuples


RECORDED = Path(__file__).with_name("judged_as_before.json")


def forget_names() -> None:
    from cachenode.http import fields

    fields._NAMES.clear()


@pytest.mark.parametrize("before_each", [forget_names, lambda: None], ids=["names-afresh", "names-remembered"])
def test_every_answer_is_judged_as_main_judged_it(before_each):
    recorded = json.loads(RECORDED.read_text())
    got = judged_rows(before_each)
    assert len(got) == len(recorded) == len(ANSWERS) * len(WAYS)
    for row, want in zip(got, recorded):
        assert row == want


if __name__ == "__main__":
    sys.stdout.write("[\n" + ",\n".join(json.dumps(row) for row in judged_rows()) + "\n]\n")
