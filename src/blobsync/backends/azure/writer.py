"""Chunked writes as Azure block blobs: block IDs from the write's nonce, Put Block, Put Block List, Get Block List."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from blobsync.backends.base import (
    NO_CONDITIONS,
    PLACEHOLDER,
    BlobHeaders,
    Buffer,
    Conditions,
    CopySource,
    PartCheck,
    Parts,
    PutResult,
    check_conditions,
)
from blobsync.errors import StagingRefusedError

if TYPE_CHECKING:
    from blobsync.backends.azure.store import AzureContainerStore

_NONCE_CHARS = 16  # the engine's nonces: 64 random bits as hex
_INDEX_DIGITS = 6  # up to 999,999 > 50,000 blocks


def block_id(nonce: str, index: int) -> str:
    """Base64 of '<nonce>-<index>': the same length for every block of a write, and the same on resume."""
    return base64.b64encode(f"{nonce}-{index:0{_INDEX_DIGITS}d}".encode("ascii")).decode("ascii")


BLOCK_ID_LENGTH = len(block_id("0" * _NONCE_CHARS, 0))
REWRITE_MAX = 256 * 1024 * 1024  # the largest one-piece blob put back whole to clear another tool's blocks


class BlockBlobWriter:
    """ChunkedWriter over one block blob. Every block ID of a blob must have one length (the service refuses
    others with InvalidBlobOrBlock): IDs of another length are another tool's, which `clear_stale` drops."""

    def __init__(self, store: AzureContainerStore, name: str, nonce: str) -> None:
        self.store = store
        self.name = name
        self.nonce = nonce

    def token(self, index: int) -> str:
        return block_id(self.nonce, index)

    async def parts(self, *, staged: bool = True) -> Parts:
        return await self.store.get_block_list(self.name, "all" if staged else "committed")

    async def stage(self, index: int, data: Buffer, check: PartCheck | None) -> None:
        await self.store.put_block(self.name, self.token(index), data, check)

    async def stage_from(self, index: int, source: CopySource, offset: int, length: int,
                         check: PartCheck | None = None) -> None:
        await self.store.put_block_from_url(self.name, self.token(index), source, offset, length, check)

    async def commit(self, parts: Sequence[tuple[str, bool]], headers: BlobHeaders,
                     conditions: Conditions = NO_CONDITIONS) -> PutResult:
        # Every entry names the list it must come from (never <Latest> for fresh blocks).
        return await self.store.put_block_list(
            self.name, [(token, "Committed" if kept else "Uncommitted") for token, kept in parts], headers,
            conditions)

    async def clear_stale(self, headers: BlobHeaders, conditions: Conditions) -> str | None:
        """Any commit or Put Blob discards every uncommitted block: write the current version again as it is."""
        store, name = self.store, self.name
        if not await self._foreign_left():
            return None
        listing = await store.get_block_list(name, "committed")
        props = await store.stat(name)
        check_conditions(props.etag if props is not None else None, conditions, f"clear blocks of {name!r}")
        if props is None:
            # No current version: an empty commit discards the blocks, and its blob goes at once (left behind, a
            # later run under --overwrite false would skip the file as there).
            placeholder = await store.put_block_list(name, [], replace(headers, metadata={PLACEHOLDER: self.nonce}),
                                                     Conditions(if_none_match_any=True))
            await store.delete(name, placeholder.etag)
            return ""
        same = BlobHeaders(props.content_type or "application/octet-stream", props.content_md5, props.metadata)
        if listing.committed:
            keep = [(p.token, "Committed") for p in listing.committed]
            return (await store.put_block_list(name, keep, same, Conditions(if_match=props.etag))).etag
        # Written in one piece (Put Blob): it has no blocks to name, so its bytes are put back.
        if props.size > REWRITE_MAX:
            raise StagingRefusedError(
                f"{name!r} holds uncommitted blocks another tool left, and its current version ({props.size} "
                "bytes, written in one piece) is too large to rewrite to clear them",
                hint="delete the blob, or wait: the service drops uncommitted blocks after a week")
        body = bytearray(props.size)
        await store.read_into(name, 0, memoryview(body), props.etag)
        result = await store.put(name, body, same, Conditions(if_match=props.etag))
        if await self._foreign_left():
            # Azure drops uncommitted blocks on Put Blob; the emulator keeps them. An empty commit drops them
            # there, and the bytes go back at once (a crash in between leaves the blob empty: the emulator only).
            emptied = await store.put_block_list(name, [], same, Conditions(if_match=result.etag))
            result = await store.put(name, body, same, Conditions(if_match=emptied.etag))
        return result.etag

    async def _foreign_left(self) -> bool:
        listing = await self.store.get_block_list(self.name, "all")
        return any(len(p.token) != BLOCK_ID_LENGTH for p in listing.staged)

    async def abort(self) -> None:
        """Uncommitted blocks expire on their own (after a week); dropping them would cost a commit."""
