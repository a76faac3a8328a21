"""What a labelled pod is given to trust the cache's certificates: one contract.

`nezha ca init` writes these files into ConfigMap `nezha-ca`; the webhook
mounts that ConfigMap at `CA_DIR` in every container of a pod a `tls: true`
rule matches and points each client's variable at them (webhook/containers.py).
Both sides read the names from here, so they cannot drift.

Every variable but NODE_EXTRA_CA_CERTS *replaces* a client's roots, so the
bundle they name carries the public roots too, then the Nezha CA. Which
client reads which was measured on Debian 12, each variable alone:

- curl: CURL_CA_BUNDLE or SSL_CERT_FILE (CURL_CA_BUNDLE masks the other);
- wget (Debian's, built with GnuTLS, ignores SSL_CERT_FILE): `ca_certificate`
  in the wgetrc that WGETRC names;
- Python requests: REQUESTS_CA_BUNDLE; botocore: AWS_CA_BUNDLE;
  huggingface_hub, httpx and Python's ssl default: SSL_CERT_FILE;
- Node: NODE_EXTRA_CA_CERTS (added to its roots: the CA alone);
- gsutil: `ca_certificates_file` in the boto config BOTO_CONFIG names;
- git: GIT_SSL_CAINFO.
"""

from __future__ import annotations

CONFIGMAP = "nezha-ca"
VOLUME = "nezha-ca"
CA_DIR = "/etc/nezha/ca"

CA_FILE = "ca.crt"  # the Nezha CA alone
BUNDLE_FILE = "ca-bundle.crt"  # the public roots, then the Nezha CA
WGETRC_FILE = "wgetrc"
BOTO_FILE = "boto.cfg"


def path(name: str) -> str:
    return f"{CA_DIR}/{name}"


# Variable -> the file it names, in the order they are added to a container.
VARIABLES: tuple[tuple[str, str], ...] = (
    ("SSL_CERT_FILE", path(BUNDLE_FILE)),
    ("CURL_CA_BUNDLE", path(BUNDLE_FILE)),
    ("REQUESTS_CA_BUNDLE", path(BUNDLE_FILE)),
    ("AWS_CA_BUNDLE", path(BUNDLE_FILE)),
    ("GIT_SSL_CAINFO", path(BUNDLE_FILE)),
    ("NODE_EXTRA_CA_CERTS", path(CA_FILE)),
    ("WGETRC", path(WGETRC_FILE)),
    ("BOTO_CONFIG", path(BOTO_FILE)),
)


def files(ca_pem: bytes, roots_pem: bytes) -> dict[str, str]:
    """The ConfigMap's data: file name -> content, for `ca_pem` and the public `roots_pem`."""
    roots = roots_pem if roots_pem.endswith(b"\n") else roots_pem + b"\n"
    return {
        CA_FILE: ca_pem.decode(),
        BUNDLE_FILE: (roots + ca_pem).decode(),
        WGETRC_FILE: f"# Written by nezha ca init: wget (GnuTLS) reads its roots only from here.\n"
                     f"ca_certificate = {path(BUNDLE_FILE)}\n",
        BOTO_FILE: f"# Written by nezha ca init, for gsutil and boto 2.\n[Boto]\n"
                   f"ca_certificates_file = {path(BUNDLE_FILE)}\n",
    }
