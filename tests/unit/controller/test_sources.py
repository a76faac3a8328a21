"""controller/sources.py: a prefetch Secret's keys, and the host each is given to."""

from __future__ import annotations

import base64

import pytest

from controller.sources import SecretUnreadable, SourceCredentials, credentials_from
from nezha.prefetch.sigv4 import AwsKeys


def data(**values: str) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}


def test_a_secret_gives_the_hub_token_and_the_aws_keys_it_holds():
    found = credentials_from("ml/creds", data(HF_TOKEN="hf_abc\n", AWS_ACCESS_KEY_ID="AKID",
                                              AWS_SECRET_ACCESS_KEY="s3cr3t", AWS_SESSION_TOKEN="tok", OTHER="x"))
    assert found == SourceCredentials("ml/creds", "hf_abc", AwsKeys("AKID", "s3cr3t", "tok"))
    assert "hf_abc" not in repr(found) and "s3cr3t" not in repr(found)


@pytest.mark.parametrize(("values", "why"), [
    ({}, "has none of HF_TOKEN"),
    ({"PASSWORD": "hunter2"}, "(keys: PASSWORD)"),
    ({"AWS_ACCESS_KEY_ID": "AKID"}, "both are needed"),
    ({"AWS_SECRET_ACCESS_KEY": "s"}, "both are needed"),
])
def test_a_secret_without_a_usable_key_is_refused_naming_its_keys_never_their_values(values, why):
    with pytest.raises(SecretUnreadable, match=why.replace("(", r"\(").replace(")", r"\)")) as e:
        credentials_from("ml/creds", data(**values))
    assert "hunter2" not in str(e.value) and "ml/creds" in str(e.value)


def test_a_value_that_is_not_base64_is_refused():
    with pytest.raises(SecretUnreadable, match="HF_TOKEN is not base64"):
        credentials_from("ml/creds", {"HF_TOKEN": "%%%"})


def test_each_key_goes_only_to_its_own_host():
    auth = SourceCredentials("ml/c", "hf_abc", AwsKeys("AKID", "s3cr3t")).auth(
        hub_host="huggingface.co", s3_host="s3.amazonaws.com", region="us-east-1")
    assert auth("https://huggingface.co/o/r/resolve/c/f", "https://hub.internal/o/r/resolve/c/f") == {
        "Authorization": "Bearer hf_abc"}
    assert auth("https://cdn-lfs.hf.co/repos/a/b/c?Signature=x", "https://cdn-lfs.hf.co/repos/a/b/c") == {}
    signed = auth("https://s3.amazonaws.com/b/k", "http://127.0.0.1:9000/b/k")
    assert signed["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID/")
    assert auth("https://data.example/x", "https://data.example/x") == {}
