"""AWS Signature Version 4 for a GET with no body, as S3 checks it. Pure: no I/O.

The controller signs the requests of a private `s3://` name with the keys of
the workload's `nezha.io/prefetch-secret`: ListObjectsV2 (sent to the S3
origin's upstream itself) and each object's GET (sent through the owner
node, which passes the request on as signed: docs/private-objects.md). The
signature covers the host the request reaches, so it is made for the
upstream's own name, which the node sends (not the public name the key is
made of). Signed fields: host, x-amz-content-sha256, x-amz-date and, with
temporary credentials, x-amz-security-token; a Range or If-None-Match a
node adds later is not signed, so it may add them.

The steps follow AWS's "Create a signed AWS API request" (canonical
request, string to sign, derived key); S3 takes the path as the client
encoded it (no second encoding) and an empty body's hash.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote, unquote, urlsplit

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True)
class AwsKeys:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # a secret never reaches a log line
        return f"AwsKeys(access_key_id={self.access_key_id[:4]}..., secret_access_key=REDACTED)"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def canonical_query(query: str) -> str:
    """Each name and value decoded, encoded again as SigV4 wants (RFC 3986 unreserved kept), sorted."""
    pairs = []
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((quote(unquote(name), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def sign_get(url: str, keys: AwsKeys, *, region: str, now: datetime | None = None,
             service: str = "s3") -> dict[str, str]:
    """The fields that sign a GET of `url` (the upstream's URL, as sent): Authorization and its companions."""
    now = now or datetime.now(timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    parts = urlsplit(url)
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    if keys.session_token:
        headers["x-amz-security-token"] = keys.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join([
        "GET", parts.path or "/", canonical_query(parts.query),
        "".join(f"{name}:{headers[name].strip()}\n" for name in sorted(headers)), signed, EMPTY_SHA256])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{keys.secret_access_key}".encode(), day), region), service),
                "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {"Authorization": f"{ALGORITHM} Credential={keys.access_key_id}/{scope}, SignedHeaders={signed}, "
                            f"Signature={signature}",
           "X-Amz-Date": stamp, "X-Amz-Content-Sha256": EMPTY_SHA256}
    if keys.session_token:
        out["X-Amz-Security-Token"] = keys.session_token
    return out
