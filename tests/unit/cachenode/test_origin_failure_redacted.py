"""A fill's failure is told to every client of it: without the leader's credentials."""

from cachenode.front.short_answers import origin_failure
from nezha.errors import OriginError, OriginTimeout


def test_an_origin_failure_names_the_url_but_not_its_signature_in_body_or_header():
    error = OriginError("origin http://s3.example/b/k?X-Amz-Credential=AKIALEADER1&X-Amz-Signature=beef "
                        "refused the connection")
    failure = origin_failure(error)
    assert failure.status == 502
    for said in (failure.text, failure.headers["X-Nezha-Origin-Error"]):
        assert "s3.example/b/k" in said and "AKIALEADER1" not in said and "beef" not in said
    assert origin_failure(OriginTimeout("origin http://h/x?sig=abc&sv=1 timed out")).status == 504
