"""The credentials of a private prefetch source: the workload's `nezha.io/prefetch-secret`.

A workload names a Secret in its own namespace; the controller reads it
with `get` (the one verb on Secrets its ClusterRole has: docs/rbac.md) each
time it starts following the workload, and keeps the keys only in memory,
for that workload's listings and fills. They are applied by host, as the
clients they stand in for apply them:

- `HF_TOKEN`: `Authorization: Bearer ...` to the Hub's host (`--hub-host`)
  alone; a redirect to the CDN is signed in its URL and gets no token, as
  `huggingface_hub` sends none there;
- `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`):
  SigV4 (nezha/prefetch/sigv4.py) on every request to the S3 host
  (`--s3-host`), signed for the upstream's own name, which is what the
  node sends on.

The origins they reach must be `credentials: authorize`: a fill made with
them is then stored without them, and every later read of it is first
allowed by the origin, asked with the reader's own request, so a pod
without credentials is denied what was prefetched (docs/private-objects.md).
With `credentials: pass` the node passes such a request through and stores
nothing: the fill fails, saying so.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from nezha.errors import NezhaError
from nezha.prefetch.sigv4 import AwsKeys, sign_get

Auth = Callable[[str, str], dict[str, str]]  # (public URL, upstream URL) -> the fields that authenticate it


class SecretUnreadable(NezhaError):
    """The Secret a workload names could not be read or holds no key a source uses; the message says which."""


@dataclass(frozen=True)
class SourceCredentials:
    secret: str  # "namespace/name", what logs and the status name
    hf_token: str | None = None
    aws: AwsKeys | None = None

    def __repr__(self) -> str:  # a token never reaches a log line
        return f"SourceCredentials(secret={self.secret!r})"

    def auth(self, *, hub_host: str, s3_host: str, region: str) -> Auth:
        """The fields for one request, by the public host it names (see the module docstring)."""
        def fields(public: str, upstream: str) -> dict[str, str]:
            host = (urlsplit(public).hostname or "").rstrip(".")
            if host == hub_host and self.hf_token:
                return {"Authorization": f"Bearer {self.hf_token}"}
            if host == s3_host and self.aws is not None:
                return sign_get(upstream, self.aws, region=region)
            return {}

        return fields


def credentials_from(secret: str, data: dict[str, str] | None) -> SourceCredentials:
    """A Secret's `data` (base64 values, as the API gives them) as credentials; SecretUnreadable when it
    holds none of the keys a source uses, or half of an AWS key pair."""
    decoded: dict[str, str] = {}
    for name, value in (data or {}).items():
        try:
            decoded[name] = base64.b64decode(value, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise SecretUnreadable(f"secret {secret}: key {name} is not base64 UTF-8 text ({e})") from e
    key_id, secret_key = decoded.get("AWS_ACCESS_KEY_ID"), decoded.get("AWS_SECRET_ACCESS_KEY")
    if bool(key_id) != bool(secret_key):
        raise SecretUnreadable(f"secret {secret}: has one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                               "both are needed")
    aws = AwsKeys(key_id, secret_key, decoded.get("AWS_SESSION_TOKEN") or None) if key_id and secret_key else None
    token = decoded.get("HF_TOKEN") or None
    if aws is None and token is None:
        raise SecretUnreadable(f"secret {secret}: has none of HF_TOKEN, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
                               f"(keys: {', '.join(sorted(decoded)) or 'none'})")
    return SourceCredentials(secret, token, aws)


async def read_credentials(api: client.ApiClient, namespace: str, name: str) -> SourceCredentials:
    """`get` the Secret `name` in `namespace`, as credentials."""
    try:
        found = await client.CoreV1Api(api).read_namespaced_secret(name, namespace)
    except ApiException as e:
        why = {403: "forbidden (the controller's ClusterRole grants get on secrets)", 404: "not found"}.get(
            e.status, f"{e.status} {e.reason}")
        raise SecretUnreadable(f"secret {namespace}/{name}: {why}") from e
    return credentials_from(f"{namespace}/{name}", found.data)
