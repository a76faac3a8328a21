"""How a fill from the parent tier goes on from the origin when the parent
breaks off mid-body: the rest of the same representation, asked by Range and
If-Range on its validator (`fill/running.py` starts such a fill; the rules of
when a node asks its parent are `fill/parent.py`'s).
"""

from __future__ import annotations

import dataclasses
from typing import AsyncIterator, Callable

import aiohttp
from multidict import CIMultiDict

from cachenode.fill.flights import Source
from cachenode.fill.parallel import if_range_validator, partial_mismatch, skip_first
from cachenode.fill.upstream import Upstream
from nezha.errors import FillAborted


def rest_from_origin(origins: Upstream, response: aiohttp.ClientResponse, source: Source, reading: dict[str, bool], *,
                     read_size: int) -> Callable[[int, BaseException], AsyncIterator[bytes]] | None:
    """How a fill from the parent goes on when the parent breaks off
    mid-body (a cluster pod restarted): the rest of the same
    representation from the origin, by Range + If-Range on its
    validator, checked as a parallel fill checks its ranges. None when
    the answer has no length or validator to resume by."""
    length = response.content_length
    validator = if_range_validator(response.headers)
    if response.status != 200 or length is None or validator is None:
        return None
    if validator.etag is not None:
        # A strong ETag alone ties the rest to the head (If-Range sends it; a 206 carries it).
        validator = dataclasses.replace(validator, last_modified=None)

    async def rest(offset: int, error: BaseException) -> AsyncIterator[bytes]:
        if offset >= length:
            return  # every byte came: whatever broke came after the body
        origins.broke_off(source.route, offset, error)
        reading["parent"] = False
        headers = CIMultiDict(source.headers)
        headers["Range"] = f"bytes={offset}-{length - 1}"
        headers["If-Range"] = validator.if_range
        answer = await origins.client.request("GET", source.url, headers=headers, what=source.what)
        try:
            skip = 0
            why = partial_mismatch(answer.status, answer.headers, first=offset, last=length - 1, total=length,
                                   validator=validator)
            if why is not None and answer.status == 200 and answer.content_length == length \
                    and validator.mismatch(answer.headers) is None:
                why, skip = None, offset  # an origin that ignores Range: the whole object, the head skipped
            if why is not None:
                raise FillAborted(f"{source.what}: the parent broke off after {offset} of {length} bytes and "
                                  f"the origin's rest cannot be joined on ({why}): nothing is stored")
            async for chunk in skip_first(answer.content.iter_chunked(read_size), skip):
                yield chunk
        finally:
            answer.release()

    return rest
