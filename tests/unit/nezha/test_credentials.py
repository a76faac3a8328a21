"""Which query parameters are credentials, per provider, and URLs with them redacted."""

import pytest

from nezha.config import Origin
from nezha.credentials import REDACTED, credential_names, query_credentials, redact_query, redact_text, redact_url
from nezha.keys import Target, credentials_kept


@pytest.mark.parametrize("query,expect", [
    # S3 SigV4 presigned
    ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20261125&X-Amz-Date=20261125T000000Z"
     "&X-Amz-Expires=600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=t&X-Amz-Signature=ab12&versionId=3",
     {"x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-expires", "x-amz-signedheaders",
      "x-amz-security-token", "x-amz-signature"}),
    # S3 SigV2 query auth (boto3 still makes these for some endpoints)
    ("AWSAccessKeyId=AKIA&Signature=s%3D&x-amz-security-token=t&Expires=1795599562",
     {"awsaccesskeyid", "signature", "x-amz-security-token", "expires"}),
    # CloudFront signed URL (Hugging Face's CDN)
    ("Expires=1795599562&Policy=eyJ&Signature=abc&Key-Pair-Id=K2", {"expires", "policy", "signature", "key-pair-id"}),
    # GCS V4 and V2
    ("X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p&X-Goog-Date=d&X-Goog-Expires=60"
     "&X-Goog-SignedHeaders=host&X-Goog-Signature=ff&generation=7",
     {"x-goog-algorithm", "x-goog-credential", "x-goog-date", "x-goog-expires", "x-goog-signedheaders",
      "x-goog-signature"}),
    ("GoogleAccessId=sa%40p&Expires=1&Signature=zz", {"googleaccessid", "expires", "signature"}),
    # Azure SAS: its response-header overrides (rsct) change the answer and stay
    ("sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-12-01T00%3A00%3A00Z&st=2026-11-25&spr=https&sig=abc%3D&rsct=text",
     {"sv", "ss", "srt", "sp", "se", "st", "spr", "sig"}),
])
def test_each_providers_signed_url_is_recognised_with_all_its_parameters(query, expect):
    assert query_credentials(query) == expect


@pytest.mark.parametrize("query", [
    "", "versionId=3", "Expires=1795599562", "sp=r&st=2026&sv=1", "X-Amz-Date=now&X-Amz-Expires=5",
    "page=2&policy=strict", "signature-style=none",
])
def test_without_a_signature_or_credential_no_parameter_is_a_credential(query):
    """A lone `Expires`, `sp` or `X-Amz-Date` is some origin's own parameter."""
    assert query_credentials(query) == frozenset()


def test_redaction_keeps_every_other_parameter_in_order_and_every_name():
    query = "b=2&X-Amz-Credential=AKIA%2Fx&a=1&X-Amz-Signature=ab12&a=3"
    assert redact_query(query) == f"b=2&X-Amz-Credential={REDACTED}&a=1&X-Amz-Signature={REDACTED}&a=3"
    assert redact_url("http://h/p?" + query).startswith("http://h/p?b=2&X-Amz-Credential=REDACTED")
    assert redact_url("/p?versionId=3") == "/p?versionId=3"
    assert redact_url("/p") == "/p"


def test_names_compare_without_case_and_a_bare_name_is_redacted_too():
    assert redact_query("x-amz-signature=1&X-AMZ-CREDENTIAL") == f"x-amz-signature={REDACTED}&X-AMZ-CREDENTIAL={REDACTED}"


def test_urls_inside_free_text_are_redacted_wherever_they_stand():
    text = ('origin http://s3.example/b/k?X-Amz-Credential=AKIA1&X-Amz-Signature=ff returned 503; '
            'retry "/b/k?sig=zz&sv=1&x=2" later')
    out = redact_text(text)
    assert "AKIA1" not in out and "ff returned" not in out and "sig=zz" not in out
    assert out.endswith(f'"/b/k?sig={REDACTED}&sv={REDACTED}&x=2" later')
    assert redact_text("no query = here?") == "no query = here?"


def test_the_key_keeps_credentials_unless_the_origin_declares_them_volatile():
    target = Target("http", "s3.example", "/b/k", "versionId=3&X-Amz-Credential=AKIA&X-Amz-Signature=ff")
    assert credentials_kept(target, None) == ["X-Amz-Credential", "X-Amz-Signature"]
    some = Origin(host="s3.example", upstream="http://127.0.0.1:1", volatile_params=("X-Amz-Signature",))
    assert credentials_kept(target, some) == ["X-Amz-Credential"]
    both = Origin(host="s3.example", upstream="http://127.0.0.1:1",
                  volatile_params=("X-Amz-Signature", "X-Amz-Credential"))
    assert credentials_kept(target, both) == []
    assert credentials_kept(Target("http", "s3.example", "/b/k", "versionId=3"), None) == []


def test_an_authorize_origin_keys_re_signed_urls_of_one_object_alike_and_keeps_other_parameters():
    from nezha.keys import key_for

    authorize = Origin(host="s3.example", upstream="http://127.0.0.1:1", credentials="authorize")
    one = Target("https", "s3.example", "/b/k", "versionId=3&X-Amz-Credential=AKIA1&X-Amz-Signature=ff")
    two = Target("https", "s3.example", "/b/k", "x-amz-credential=AKIA2&versionId=3&x-amz-signature=ee")
    azure = Target("https", "s3.example", "/b/k", "sv=1&sig=zz&versionId=3")
    assert key_for(one, authorize) == key_for(two, authorize) == key_for(azure, authorize) \
        == "https://s3.example/b/k?versionId=3"
    assert credentials_kept(one, authorize) == []
    plain = Origin(host="s3.example", upstream="http://127.0.0.1:1")
    assert key_for(one, plain) != key_for(two, plain)  # pass: such a request is never stored at all


def test_an_oauth2_access_token_in_the_query_is_a_credential_for_every_origin():
    """RFC 6750 §2.3: `access_token` in the URI query is a bearer token (GCS's JSON API accepts it)."""
    assert credential_names("alt=media&access_token=ya29.secret") == ["access_token"]
    assert redact_url("/b/o?alt=media&access_token=ya29.secret") == f"/b/o?alt=media&access_token={REDACTED}"


def test_an_origins_own_credential_params_are_credentials_whenever_present_in_any_case():
    from nezha.keys import key_for

    own = Origin(host="api.example", upstream="http://127.0.0.1:1", credential_params=("token",))
    target = Target("http", "api.example", "/d/shard-0", "rev=2&Token=t0p-secret")
    assert credentials_kept(target, own) == ["Token"]  # pass: never stored under a key holding it
    assert credentials_kept(target, None) == []  # unknown elsewhere: no family marks it
    authorize = own.model_copy(update={"credentials": "authorize"})
    assert key_for(target, authorize) == "http://api.example/d/shard-0?rev=2"
    assert redact_url("/d?rev=2&Token=t0p-secret", extra=own.credential_params) == f"/d?rev=2&Token={REDACTED}"


@pytest.mark.parametrize("name", ["", "a=b", "x&y", "sp ace"])
def test_a_credential_param_that_is_no_parameter_name_is_refused(name):
    with pytest.raises(ValueError, match="credential_params"):
        Origin(host="api.example", upstream="http://127.0.0.1:1", credential_params=(name,))
