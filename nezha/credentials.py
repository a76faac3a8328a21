"""Credentials a request carries in its URL: which query parameters they
are, and the URL with their values redacted. Pure: no I/O.

A presigned URL is a bearer credential: anyone holding it reads the object
until it expires. So its signature, and the access key id beside it, must
never reach a log line, a metadata file, Redis or a metrics label, and a
response to it is never stored under a key that holds them
(docs/http-semantics.md, "Credentials").

The families below are recognised by a parameter only a signed URL carries
(its signature or credential); once one is, every parameter of that family
is a credential parameter of the URL. Names compare case-insensitively:
providers document one spelling, clients and proxies do not all keep it.
An origin may name more (`credential_params` in its entry: an API's own
`token=` or `key=`); every function here takes those as `extra`, counted
as credentials whenever present.
"""

from __future__ import annotations

import re
from typing import Iterable

# family: (the parameters that mark a signed URL of it, every parameter of it)
_FAMILIES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # S3 SigV4 presigned (also MinIO, Ceph, SeaweedFS, R2, any S3 API).
    "s3-v4": (frozenset({"x-amz-signature", "x-amz-credential"}),
              frozenset({"x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires",
                         "x-amz-signedheaders", "x-amz-signature", "x-amz-security-token"})),
    # S3 SigV2 query auth, GCS V2 signed URLs, CloudFront signed URLs
    # (Hugging Face's CDN): all carry `Signature` with their own companions.
    "signature": (frozenset({"signature"}),
                  frozenset({"signature", "awsaccesskeyid", "googleaccessid", "expires", "policy", "key-pair-id",
                             "x-amz-security-token"})),
    # GCS V4 signed URLs.
    "gcs-v4": (frozenset({"x-goog-signature", "x-goog-credential"}),
               frozenset({"x-goog-algorithm", "x-goog-credential", "x-goog-date", "x-goog-expires",
                          "x-goog-signedheaders", "x-goog-signature"})),
    # Azure shared access signatures (account, service and user delegation
    # SAS). The `rsc*` response-header overrides are signed but change the
    # answer, so they stay part of what the URL names.
    # OAuth 2.0 bearer tokens in the URI query (RFC 6750 §2.3; GCS's JSON
    # API and Google APIs accept it).
    "oauth2": (frozenset({"access_token"}), frozenset({"access_token"})),
    "azure-sas": (frozenset({"sig"}),
                  frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sip", "sig", "sr", "si", "ses", "sdd",
                             "skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid"})),
}

REDACTED = "REDACTED"


def _name(pair: str) -> str:
    return pair.split("=", 1)[0]


def credential_params(names: Iterable[str], extra: Iterable[str] = ()) -> frozenset[str]:
    """The credential parameters among a query's parameter `names`,
    lowercased: every parameter of each signed-URL family the query
    carries, and each of `extra` (an origin's own) present."""
    present = {n.lower() for n in names}
    found = present & {n.lower() for n in extra}
    for marks, members in _FAMILIES.values():
        if present & marks:
            found |= present & members
    return frozenset(found)


def query_credentials(query: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """`credential_params` of a raw query string (`a=1&X-Amz-Signature=...`)."""
    return credential_params((_name(p) for p in query.split("&") if p), extra) if query else frozenset()


def credential_names(query: str, extra: Iterable[str] = ()) -> list[str]:
    """The credential parameters of a raw query, named as written, in order, each once."""
    secret = query_credentials(query, extra)
    if not secret:
        return []
    return [n for n in dict.fromkeys(_name(p) for p in query.split("&") if p) if n.lower() in secret]


def redact_query(query: str, extra: Iterable[str] = ()) -> str:
    """`query` with the value of every credential parameter replaced by
    REDACTED; everything else, order included, as it was."""
    secret = query_credentials(query, extra)
    if not secret:
        return query
    return "&".join(f"{_name(p)}={REDACTED}" if _name(p).lower() in secret else p for p in query.split("&"))


def redact_url(url: str, extra: Iterable[str] = ()) -> str:
    """A URL, an origin-form target or a cache key with its credential
    parameters redacted (the query is what follows the first `?`; a fragment
    never reaches a cache)."""
    head, sep, query = url.partition("?")
    return head + sep + redact_query(query, extra) if sep else url


# A query string inside free text: from a `?` to the first character no URL
# in a log line carries unquoted.
_QUERY_IN_TEXT = re.compile(r"\?([^\s\"'<>`]+)")


def redact_text(text: str, extra: Iterable[str] = ()) -> str:
    """Free text (a log field, an error message) with the credential
    parameters of every query string in it redacted."""
    if "?" not in text or "=" not in text:
        return text
    return _QUERY_IN_TEXT.sub(lambda m: "?" + redact_query(m.group(1), extra), text)
