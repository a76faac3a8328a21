"""No log line carries a URL's credentials (nezha/logs.py, nezha/credentials.py)."""

from __future__ import annotations

import io
import json

import structlog

from nezha import logs


def test_a_logged_presigned_url_carries_no_credential_in_any_field():
    out = io.StringIO()
    logs.configure(stream=out)
    structlog.get_logger("test").info(
        "request_completed", path="/b/k?X-Amz-Credential=AKIA9&X-Amz-Signature=ff00&part=2",
        errors=["origin http://s/b/k?sig=abc&sv=1 refused", 3], status=200)
    [line] = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["path"] == "/b/k?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&part=2"
    assert line["errors"] == ["origin http://s/b/k?sig=REDACTED&sv=REDACTED refused", 3]
    assert line["status"] == 200


def test_an_origins_own_credential_params_given_at_start_up_are_redacted_too():
    out = io.StringIO()
    logs.configure(stream=out, credential_params=["Token"])
    structlog.get_logger("test").info("request_completed", path="/d/shard?rev=2&token=t0p-secret")
    [line] = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["path"] == "/d/shard?rev=2&token=REDACTED"
