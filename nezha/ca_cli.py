"""`nezha ca init --local DIR`: the CA whose leaves cache nodes present for HTTPS dataset hosts.

Made once and kept: every pod that trusts it would break if it changed
under them, so a run that finds a valid CA writes nothing, and one that
finds half a CA or a broken one says so and changes nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path

from nezha.errors import RunError
from nezha.pki import Pair, make_ca, renewal_reason

CA_NAME = "nezha-ca"
RENEW_DAYS = 30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ca", help="the CA for HTTPS dataset hosts")
    actions = p.add_subparsers(dest="ca_command", metavar="ACTION")
    actions.required = True
    init = actions.add_parser("init", help="create the CA once (idempotent)",
                              description="Create the CA cache nodes sign dataset hosts' certificates with: "
                                          "DIR/ca.crt (give it to clients) and DIR/ca.key (only cache nodes may "
                                          "read it, mode 0600). A valid CA already there is kept.")
    init.add_argument("--local", type=Path, required=True, metavar="DIR",
                      help="folder for ca.crt and ca.key (created if missing)")
    init.set_defaults(func=run_init)


def init_local(folder: Path, *, now: dt.datetime | None = None) -> tuple[Pair, bool]:
    """The CA in `folder`, and whether this call created it."""
    now = now or dt.datetime.now(dt.timezone.utc)
    cert_path, key_path = folder / "ca.crt", folder / "ca.key"
    present = [p for p in (cert_path, key_path) if p.exists()]
    if len(present) == 1:
        missing = key_path if present[0] == cert_path else cert_path
        raise RunError(f"{present[0]} exists but {missing} does not: refusing to replace half a CA that clients "
                       f"may trust; restore it or remove both files")
    if present:
        try:
            pair = Pair.load(cert_path.read_bytes(), key_path.read_bytes())
        except (OSError, ValueError) as e:
            raise RunError(f"cannot read the CA in {folder}: {e}") from e
        reason = renewal_reason(pair, now=now, renew_days=RENEW_DAYS)
        if reason is not None:
            raise RunError(f"the CA in {folder} cannot be kept ({reason}); rotating it is deliberate: "
                           f"see docs/https.md")
        return pair, False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        pair = make_ca(now=now, name=CA_NAME)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pair.key_pem)
        cert_path.write_bytes(pair.cert_pem)
    except OSError as e:
        raise RunError(f"cannot write the CA to {folder}: {e.strerror or e}") from e
    return pair, True


def run_init(args: argparse.Namespace) -> int:
    pair, created = init_local(args.local)
    print(f"{'created' if created else 'kept'} {args.local / 'ca.crt'} (expires "
          f"{pair.cert.not_valid_after_utc:%Y-%m-%d}); key {args.local / 'ca.key'}, readable by its owner only")
    return 0
