"""What every chunked write (upload, stream, service copy, a cluster's split file) shares: parts another writer left
cleared, and the one commit: its parts in order, its own earlier commit recognised, what the store then holds
checked against what was sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from blobsync.backends.base import NO_CONDITIONS, BlobHeaders, ChunkedWriter, Conditions, PutResult
from blobsync.engine.blocks import block_ranges
from blobsync.engine.context import EngineContext
from blobsync.engine.tasks import cancel_all, gather_or_cancel
from blobsync.errors import ConflictError, IntegrityError, InvalidBlockListError, StagingRefusedError


class ForeignParts:
    """Parts another writer left, for one chunked write whose parts are staged side by side (a stream, a service
    copy): the store refuses every part of the write while they are there, so the first part refused clears them
    (once for the whole write, the others refused meanwhile waiting for that one clear) and each refused part is
    staged again. `conditions` are what the write's commit needs afterwards. With `clear=False` (a split file's
    range: the client cleared them before its ranges began, and a clear now would drop the other ranges' parts)
    a refusal is the write's failure."""

    def __init__(self, ctx: EngineContext, writer: ChunkedWriter, headers: BlobHeaders, conditions: Conditions, *,
                 clear: bool = True) -> None:
        self.ctx, self.writer, self.headers, self.conditions, self.clear = ctx, writer, headers, conditions, clear
        self._clearing: asyncio.Future[Conditions | None] | None = None

    async def stage(self, send: Callable[[], Awaitable[object]]) -> None:
        """`send()` (one part's staging request), again once the parts in its way are cleared."""
        try:
            await send()
            return
        except StagingRefusedError:
            if not self.clear:
                raise
            if self._clearing is None:
                self._clearing = asyncio.ensure_future(clear_foreign(self.ctx, self.writer, self.headers,
                                                                     self.conditions))
            cleared = await asyncio.shield(self._clearing)
            if cleared is None:
                raise
            self.conditions = cleared
        await send()

    async def settle(self) -> None:
        """Wait for a clear under way (it rewrites the current version: it ends as it began)."""
        if self._clearing is not None:
            await asyncio.gather(self._clearing, return_exceptions=True)


def part_layout(writer: ChunkedWriter, size: int, block_size: int) -> tuple[list[str], dict[str, int]]:
    """A write's parts: the token at each index, and the length the commit must show for each."""
    ranges = list(block_ranges(size, block_size))
    tokens = [writer.token(i) for i, _, _ in ranges]
    return tokens, {tokens[i]: length for i, _, length in ranges}


async def clear_foreign(ctx: EngineContext, writer: ChunkedWriter, headers: BlobHeaders, conditions: Conditions
                        ) -> Conditions | None:
    """After the store refused a part because another writer's parts are staged (StagingRefusedError): those parts
    dropped, the current version kept as it is if `conditions` hold for it (a commit drops every staged part, this
    write's own too: it stages them again). Returns the conditions the write's commit now needs; None when there was
    nothing to clear."""
    etag = await ctx.request(lambda: writer.clear_stale(headers, conditions))
    if etag is None:
        return None
    # The version compared was written again as it was: still the one to replace. Create-only stays create-only.
    return Conditions(if_match=etag) if conditions.if_match else conditions


async def commit_checked(ctx: EngineContext, writer: ChunkedWriter, blob: str, parts: Sequence[tuple[str, bool]],
                         lengths: Mapping[str, int], headers: BlobHeaders, conditions: Conditions = NO_CONDITIONS
                         ) -> PutResult:
    """Commit `parts` ((token, kept) in order), then check the block list, the length and headers.content_md5.

    A commit refused because an earlier try of it landed (its answer lost: the parts are committed now, so they are
    not staged and a create-only or If-Match condition no longer holds) is this write's own when the committed list
    is exactly these parts, whose new ones carry this write's nonce."""
    try:
        result = await ctx.request(lambda: writer.commit(parts, headers, conditions))
    except (ConflictError, InvalidBlockListError):
        landed = await ctx.request(lambda: writer.parts(staged=False))
        if [p.token for p in landed.committed] != [token for token, _ in parts] or not landed.etag:
            raise
        result = PutResult(landed.etag, None)
    await _verify(ctx, writer, blob, [token for token, _ in parts], lengths, headers.content_md5)
    return result


async def _verify(ctx: EngineContext, writer: ChunkedWriter, blob: str, tokens: list[str],
                  lengths: Mapping[str, int], md5: bytes | None) -> None:
    # Both asked at once: on a long link the check then costs one round trip, not two.
    asked = (asyncio.ensure_future(ctx.request(lambda: writer.parts(staged=False))),
             asyncio.ensure_future(ctx.request(lambda: ctx.store.stat(blob))))
    try:
        await gather_or_cancel(asked)
    except BaseException:
        await cancel_all(asked)
        raise
    listing, props = asked[0].result(), asked[1].result()
    if [(p.token, p.size) for p in listing.committed] != [(t, lengths[t]) for t in tokens]:
        raise IntegrityError(f"{blob}: the committed block list differs from the one sent")
    size = sum(lengths[t] for t in tokens)
    if props is None or props.size != size:
        raise IntegrityError(f"{blob}: the blob's length after commit is not {size}")
    if md5 is not None and props.content_md5 != md5:
        raise IntegrityError(f"{blob}: the blob's Content-MD5 after commit differs from the file's MD5")
