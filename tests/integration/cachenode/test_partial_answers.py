"""A range of an object carries no field that describes the whole of it.

S3 sends `x-amz-checksum-crc32` (and its siblings) with an object stored
with a checksum; boto3 with checksum validation compares it against the
bytes it receives, so a 206 that kept it would fail every ranged read of
such an object (issue 22, "correct headers on a served hit"). S3 itself
leaves them off a ranged answer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import zlib

PATH = "/datasets/with-checksum.bin"
BODY = bytes(range(256)) * 64


def fields(body: bytes) -> dict[str, str]:
    """The fields S3 sends with `body`, its checksums real: a fill checks them (cachenode/fill/verify.py)."""
    return {"x-amz-checksum-crc32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode(),
            "Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode(),
            "x-amz-meta-owner": "team-a", "Cache-Control": "max-age=600"}


FIELDS = fields(BODY)
CRC32 = FIELDS["x-amz-checksum-crc32"]


async def test_a_range_from_disk_drops_the_whole_object_checksums_and_keeps_the_rest(origin, make_node, session):
    origin.put(PATH, BODY, headers=FIELDS)
    node = await make_node()
    status, whole, got = await node.get(session, PATH)
    assert status == 200 and got == BODY and whole["x-amz-checksum-crc32"] == CRC32
    await node.node.settled()
    status, part, got = await node.get(session, PATH, headers={"Range": "bytes=100-199"})
    assert status == 206 and got == BODY[100:200] and part["X-Nezha-Cache"] == "hit"
    assert "x-amz-checksum-crc32" not in part and "Content-MD5" not in part
    assert part["x-amz-meta-owner"] == "team-a" and part["ETag"] == whole["ETag"]
    status, again, _ = await node.get(session, PATH)
    assert status == 200 and again["x-amz-checksum-crc32"] == CRC32  # the whole object keeps them


async def test_a_range_from_a_fill_in_progress_drops_them_too(origin, make_node, session):
    origin.put(PATH, BODY * 16, headers=fields(BODY * 16), rate=256 * 1024)  # about a second of body
    node = await make_node()
    leader = asyncio.create_task(node.get(session, PATH))
    await asyncio.sleep(0)
    status, part, got = await node.get(session, PATH, headers={"Range": "bytes=0-99"})
    assert status == 206 and got == (BODY * 16)[:100]
    assert "x-amz-checksum-crc32" not in part and "Content-MD5" not in part
    assert (await leader)[0] == 200
