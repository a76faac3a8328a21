"""nezha/prefetch/sigv4.py signs as botocore signs: the same request, the same Authorization."""

from __future__ import annotations

from datetime import datetime, timezone

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from nezha.prefetch.sigv4 import AwsKeys, canonical_query, sign_get

NOW = datetime(2026, 11, 27, 8, 30, 0, tzinfo=timezone.utc)


def botocore_signature(url: str, keys: AwsKeys, region: str, monkeypatch) -> dict[str, str]:
    request = AWSRequest(method="GET", url=url, headers={"X-Amz-Content-SHA256": "e3b0c44298fc1c149afbf4c8996fb9"
                                                         "2427ae41e4649b934ca495991b7852b855"})
    auth = S3SigV4Auth(Credentials(keys.access_key_id, keys.secret_access_key, keys.session_token), "s3", region)
    # botocore's clock, fixed as the test fixes ours (it reads a naive UTC time).
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))
    auth.add_auth(request)
    return dict(request.headers)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000/private/train/shard-00.bin",
    "https://s3.amazonaws.com/private?continuation-token=tok%2F1%3D&list-type=2&max-keys=2&prefix=train%2F",
    "https://s3.amazonaws.com/bkt/a%20b/c~d%2Be.bin",
])
@pytest.mark.parametrize("session", [None, "IQoJb3JpZ2luX2VjEXAMPLE+token/=="])
def test_a_get_is_signed_exactly_as_botocore_signs_it(url, session, monkeypatch):
    keys = AwsKeys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", session)
    ours = sign_get(url, keys, region="us-east-1", now=NOW)
    theirs = botocore_signature(url, keys, "us-east-1", monkeypatch)
    assert ours["Authorization"] == theirs["Authorization"]
    assert ours["X-Amz-Date"] == theirs["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == theirs.get("X-Amz-Security-Token")


def test_the_canonical_query_is_sorted_and_encoded_once():
    assert canonical_query("prefix=a%2Fb&list-type=2&x=") == "list-type=2&prefix=a%2Fb&x="
    assert canonical_query("") == ""


def test_keys_never_show_their_secret():
    assert "wJal" not in repr(AwsKeys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"))
