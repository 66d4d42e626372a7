"""Delta uploads: which blocks of a changed file the blob's committed version (as blobsync left it) still holds."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from blobsync.engine.context import EngineContext
from blobsync.journal import CommittedBlob

log = logging.getLogger("blobsync")


@dataclass(frozen=True)
class DeltaBase:
    """The committed version a new version of the file builds on: unchanged blocks keep their committed IDs."""

    block_size: int
    etag: str  # the commit must be conditional on it: a concurrent writer makes it fail, never mix
    blocks: tuple[tuple[str, int, bytes], ...]

    def block_at(self, idx: int, length: int) -> tuple[str, bytes] | None:
        """(committed ID, xxh3-128) of the committed block at the same index and length, if there is one.

        Only the same index (same offset) is compared: in-place edits and appends keep every other block
        where it was; an insertion that shifts the rest is sent in full."""
        if idx >= len(self.blocks):
            return None
        bid, old_length, old_digest = self.blocks[idx]
        return (bid, old_digest) if old_length == length else None


async def find_base(ctx: EngineContext, blob: str, size: int) -> DeltaBase | None:
    """The journal's record of the blob's last blobsync commit, if the blob is still exactly that version."""
    if not ctx.store.capabilities.keeps_parts:
        return None
    record = ctx.journal.committed_blob(ctx.store.container_url, blob)
    if record is None or not record.blocks:
        return None
    max_parts = ctx.store.capabilities.max_parts
    if size > record.block_size * max_parts:
        # Keeping the block size stable is what makes blocks line up; a file that outgrew it starts over.
        log.info("%s: grew past %d blocks of %d bytes: full upload with a larger block size",
                 blob, max_parts, record.block_size)
        return None
    props = await ctx.request(lambda: ctx.store.stat(blob))
    if props is None or props.etag != record.etag:
        log.info("%s: the blob was changed or removed since blobsync committed it: full upload", blob)
        return None
    return DeltaBase(record.block_size, record.etag, record.blocks)


def committed_record(block_size: int, etag: str, size: int, md5: bytes | None,
                     blocks: Sequence[tuple[str, int, bytes]]) -> CommittedBlob:
    return CommittedBlob(block_size, etag, size, md5.hex() if md5 else None, tuple(blocks))
