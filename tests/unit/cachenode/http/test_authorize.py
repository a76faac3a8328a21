"""The probe an authorised read sends, and what its answer means (cachenode/http/authorize.py)."""

import pytest

from cachenode.fill.lead import Answer, Step, decide
from cachenode.http.authorize import Verdict, asks_own_range, not_probeable, probe_fields, verdict
from cachenode.http.freshness import response_policy


def test_the_probe_is_the_callers_request_as_sent_plus_a_validator_and_a_one_byte_range():
    sent = [("Authorization", "AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=ff"), ("x-amz-date", "20261125T0"),
            ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"), ("User-Agent", "Boto3/1.35")]
    assert probe_fields(sent, etag='"abc"') == [*sent, ("If-None-Match", '"abc"'), ("Range", "bytes=0-0")]


def test_a_callers_signed_range_and_if_match_stay_and_the_probe_adds_no_range_of_its_own():
    """boto3's download_file signs each part's Range and If-Match: both go
    as sent, and the origin evaluates If-Match before the probe's
    If-None-Match (RFC 9110 §13.2.2), so a 304 still means both hold."""
    sent = [("Authorization", "AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=ff"), ("Range", "bytes=8388608-16777215"),
            ("If-Match", '"abc"'), ("x-amz-checksum-mode", "ENABLED")]
    assert probe_fields(sent, etag='"abc"') == [*sent, ("If-None-Match", '"abc"')]
    assert asks_own_range(sent) and not asks_own_range(sent[2:])
    assert not_probeable(name for name, _ in sent) is None


def test_no_etag_no_probe():
    """Two versions may share a Last-Modified second: only an ETag vouches for the stored one."""
    assert probe_fields([("Authorization", "Bearer t")], etag=None) is None


@pytest.mark.parametrize("names,why", [
    (["if-none-match"], "request sets if-none-match"),
    (["Range", "If-Range"], "request sets If-Range"),
    (["If-Modified-Since"], "request sets If-Modified-Since"),
    (["If-Match", "If-Unmodified-Since"], "request sets If-Unmodified-Since"),
    (["Authorization", "x-amz-checksum-mode", "User-Agent"], None),
    (["Authorization", "Range", "If-Match"], None),
])
def test_a_request_whose_fields_the_probes_if_none_match_would_change_cannot_become_a_probe(names, why):
    assert not_probeable(names) == why


def test_an_azure_shared_key_request_cannot_become_a_probe_but_shared_key_lite_and_sigv4_can():
    """Shared Key's string to sign holds If-None-Match and Range, sent or
    not; SigV4 checks only the fields it lists, Shared Key Lite neither."""
    assert "Shared Key" in not_probeable({"Authorization": "SharedKey acct:c2ln", "x-ms-version": "2021-08-06"})
    assert not_probeable({"Authorization": "SharedKeyLite acct:c2ln"}) is None
    assert not_probeable({"Authorization": "AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=ff"}) is None


@pytest.mark.parametrize("status,expect", [
    (304, Verdict.ALLOWED), (200, Verdict.CHANGED), (206, Verdict.CHANGED), (416, Verdict.CHANGED),
    (401, Verdict.REFUSED), (403, Verdict.REFUSED), (404, Verdict.REFUSED), (412, Verdict.REFUSED),
    (500, Verdict.REFUSED), (503, Verdict.REFUSED), (301, Verdict.REFUSED),
])
def test_only_a_304_lets_the_stored_copy_answer_and_only_a_200_206_or_416_says_it_changed(status, expect):
    assert verdict(status) is expect


def _answer(headers: dict, *, authorize: bool, vary=()) -> Answer:
    policy = response_policy(200, headers, now=0.0, policy_ttl=None, private_ok=authorize)
    return Answer(status=200, policy=policy, vary=tuple(vary), vary_listed=", ".join(vary), has_validator=True,
                  authorized_reads=authorize, has_etag="ETag" in headers)


def test_a_private_response_is_stored_only_for_an_origin_that_authorises_each_read():
    headers = {"Cache-Control": "private, max-age=60", "ETag": '"v"'}
    assert decide(_answer(headers, authorize=False), stale_held=False, stale_usable_on_error=False).step is Step.PASS
    assert decide(_answer(headers, authorize=True), stale_held=False, stale_usable_on_error=False).step is Step.FILL


def test_an_authorize_origins_answer_without_an_etag_or_varying_on_a_credential_is_not_stored():
    no_etag = decide(_answer({"Cache-Control": "max-age=60", "Last-Modified": "Wed, 01 Jan 2025 00:00:00 GMT"},
                             authorize=True), stale_held=False, stale_usable_on_error=False)
    assert no_etag.step is Step.PASS and "no ETag" in no_etag.reason
    for name in ("Authorization", "Cookie", "X-Api-Key", "x-amz-security-token"):
        varies = decide(_answer({"ETag": '"v"', "Cache-Control": "max-age=60"}, authorize=True, vary=[name]),
                        stale_held=False, stale_usable_on_error=False)
        assert varies.step is Step.PASS and "credential" in varies.reason
