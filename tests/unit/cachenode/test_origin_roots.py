"""Which https:// (host, port) each origin's own CA bundle is for (cachenode/app.py origin_roots)."""

from __future__ import annotations

import trustme

from cachenode.app import origin_roots
from nezha.config import CacheSettings, Origin


def test_a_bundle_covers_the_https_upstreams_an_origin_names_and_a_patterns_whole_domain(tmp_path):
    bundle = tmp_path / "roots.pem"
    trustme.CA().cert_pem.write_to_path(str(bundle))
    settings = CacheSettings(origins=[
        Origin(host="datasets.example", upstream="https://mirror.example:8443", ca_bundle=bundle),
        Origin(host="www.cs.toronto.edu", upstream="http://www.cs.toronto.edu", ca_bundle=bundle),
        Origin(host="*.s3.amazonaws.com", upstream="https://{host}", ca_bundle=bundle),
        Origin(host="huggingface.co", upstream="https://huggingface.co")])  # no bundle: the system store
    assert origin_roots(settings) == {
        ("mirror.example", 8443): bundle,
        ("www.cs.toronto.edu", 443): bundle,  # its TLS clients' requests go to https://HOST
        ("*.s3.amazonaws.com", 443): bundle,
    }
