"""Who may call a node's internal endpoints (replicate, hand-off)."""

import pytest

from cachenode.peers.auth import refuse_internal


@pytest.mark.parametrize("remote,token,presented,allowed,why", [
    ("127.0.0.1", None, None, True, None),
    ("::1", None, None, True, None),
    ("10.0.0.7", None, None, False, "only when cluster_token is set"),
    (None, None, None, False, "only when cluster_token is set"),
    ("10.0.0.7", "s3cret", "s3cret", True, None),
    ("127.0.0.1", "s3cret", None, False, "needs the cluster token"),
    ("10.0.0.7", "s3cret", "guess", False, "wrong cluster token"),
])
def test_internal_endpoints_need_the_token_or_loopback(remote, token, presented, allowed, why):
    reason = refuse_internal(remote=remote, token=token, presented=presented)
    assert (reason is None) is allowed
    if why:
        assert why in reason
