"""One blob copied from another store: read by the destination's service (one request when small, block ranges
staged in parallel and journaled when large), or, when that service cannot reach the source, through this machine
as an upload of the source's bytes (the same blocks, checks, resume and MD5)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import PurePosixPath

from blobsync.backends.base import (
    BlobHeaders,
    BlobProperties,
    Capabilities,
    ChunkedWriter,
    Conditions,
    CopySource,
    PutResult,
    Store,
)
from blobsync.config import TransferConfig
from blobsync.engine.blocks import block_count, block_ranges, choose_block_size, new_nonce
from blobsync.engine.commit import ForeignParts, commit_checked, part_layout
from blobsync.engine.context import EngineContext
from blobsync.engine.fetching import read_checked
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.overwrite import created_meanwhile, created_only, write_conditions
from blobsync.engine.tasks import for_each
from blobsync.engine.upload import OCTET_STREAM, FileUploader
from blobsync.errors import (
    BlobNotFoundError,
    ConflictError,
    CopySourceError,
    SourceChangedError,
    UsageError,
)
from blobsync.journal import FileRow, FileState
from blobsync.local.files import FileIdentity
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")


def copy_headers(cfg: TransferConfig, props: BlobProperties, caps: Capabilities) -> BlobHeaders:
    """The properties a copy of `props` gets: the source's (--s2s-preserve-properties) with what the flags set
    (--content-type, --metadata, --cache-control, ..., --blob-tags) over them; the tier the flag names or, with
    --s2s-preserve-access-tier, the source's. What the destination (`caps`) cannot keep of the source's is left out."""
    keep, valid = cfg.s2s_preserve_properties, caps.metadata_name or bool
    kept = {k: v for k, v in props.metadata.items() if valid(k)} if keep else {}
    if keep and len(kept) < len(props.metadata):  # another cloud's names ('x-owner'): AzCopy's ExcludeIfInvalid
        log.info("%s: metadata %s left out (not valid names here)", props.name,
                 ", ".join(sorted(set(props.metadata) - set(kept))))
    metadata = {**kept, **cfg.metadata}
    properties = {**({k: v for k, v in props.properties.items() if k in caps.properties} if keep else {}),
                  **cfg.properties}
    content_type = cfg.content_type or (props.content_type if keep and props.content_type else OCTET_STREAM)
    source_tier = props.tier if cfg.s2s_preserve_access_tier and props.tier in caps.tiers else None
    return BlobHeaders(content_type, props.content_md5 if keep else None, metadata, cfg.tier or source_tier,
                       properties, cfg.blob_tags)


def copy_block_size(cfg: TransferConfig, caps: Capabilities, size: int) -> int:
    """The part size of a staged copy of `size` bytes: the engine's rule, within what one Put Block From URL takes."""
    return min(choose_block_size(size, cfg.block_size, caps), caps.stage_copy_max)


def one_request(cfg: TransferConfig, caps: Capabilities, size: int) -> bool:
    """Whether a copy is one Copy Blob From URL: up to --put-blob-size-mb (the block size unless given, AzCopy's
    rule: above it, parallel ranges are faster and resume in parts) and that request's limit, and (as it takes
    the source's properties and metadata as they are) nothing is to change."""
    return (size <= min(cfg.single_put_limit, caps.copy_max) and cfg.s2s_preserve_properties
            and not (cfg.metadata or cfg.properties or cfg.content_type or cfg.blob_tags))


async def source_tags(cfg: TransferConfig, source: Store, ctx: EngineContext, name: str) -> Mapping[str, str]:
    """The source blob's tags to keep (--s2s-preserve-blob-tags), with --blob-tags over them; else --blob-tags."""
    if not cfg.s2s_preserve_blob_tags:
        return cfg.blob_tags
    return {**await ctx.request(lambda: source.tags(name)), **cfg.blob_tags}


class BlobCopier:
    """Copies blobs of one job from `source` into the context's store. Errors that concern only the blob are
    raised as such; the runner records them."""

    def __init__(self, ctx: EngineContext, source: Store) -> None:
        self.ctx = ctx
        self.source = source
        caps = ctx.store.capabilities
        self.by_service = (not ctx.config.s2s_via_client and source.capabilities.copy_sources
                           and caps.stage_copy_max > 0)
        self.fallback: str | None = None  # why this job copies through this machine after all
        if ctx.config.s2s_preserve_blob_tags and not source.capabilities.tags:
            raise UsageError(f"--s2s-preserve-blob-tags: {source.display_url} keeps no blob index tags to copy")

    async def copy(self, row: FileRow, listed: BlobProperties) -> FileResult:
        ctx = self.ctx
        ctx.store.check_name(row.blob)
        conditions = await write_conditions(ctx, row.blob, destination_mtime_ns(listed), row.nonce)
        if isinstance(conditions, str):
            return FileResult(row.rel, row.blob, listed.size, FileStatus.SKIPPED, reason=conditions)
        if self.by_service:
            try:
                return await self._by_service(row, listed, conditions)
            except CopySourceError as exc:
                self._fall_back(exc)
        return await self._through_here(row, listed, conditions)

    def _fall_back(self, exc: CopySourceError) -> None:
        """The destination's service cannot read the source: every copy of this job goes through this machine."""
        if self.by_service:
            self.by_service = False
            self.fallback = str(exc)
            log.warning("%s: copying through this machine instead (as --s2s-via-client)", exc)

    async def _by_service(self, row: FileRow, listed: BlobProperties, conditions: Conditions) -> FileResult:
        ctx, cfg = self.ctx, self.ctx.config
        caps = ctx.store.capabilities
        block = copy_block_size(cfg, caps, listed.size)
        if one_request(cfg, caps, listed.size) and row.nonce is None:
            return await self._copy_whole(row, listed, conditions)
        for attempt in (1, 2):
            props = await self._stat_source(listed)
            try:
                return await self._copy_staged(row, props, conditions, block)
            except ConflictError as exc:
                if exc.code != "SourceConditionNotMet":
                    raise
                if attempt == 2:  # changed twice while being copied: a file someone keeps rewriting
                    raise SourceChangedError(f"{props.name}: the source changed while it was being copied") from exc
                log.info("%s changed during the copy; starting it again", props.name)
        raise AssertionError("unreachable")

    async def _stat_source(self, listed: BlobProperties) -> BlobProperties:
        props = await self.ctx.request(lambda: self.source.stat(listed.name))
        if props is None:
            raise BlobNotFoundError(f"source blob {listed.name!r} is gone (deleted since it was listed)",
                                    status=404, code="BlobNotFound")
        return props

    async def _copy_whole(self, row: FileRow, listed: BlobProperties, conditions: Conditions) -> FileResult:
        ctx, cfg = self.ctx, self.ctx.config
        source = await self.source.copy_source(listed.name, listed.etag or None, ctx.store.location)
        tier = cfg.tier or (listed.tier if cfg.s2s_preserve_access_tier and listed.tier in ctx.store.capabilities.tiers
                                else None)
        copy_tags = cfg.s2s_preserve_blob_tags
        try:
            result = await ctx.request(lambda: ctx.store.copy_from(row.blob, source, conditions, tier, copy_tags))
        except ConflictError as exc:
            if created_only(exc, conditions):
                landed = await created_meanwhile(ctx, row.blob, listed.size, listed.content_md5)
                if isinstance(landed, str):
                    return FileResult(row.rel, row.blob, listed.size, FileStatus.SKIPPED, reason=landed)
                result = PutResult(landed.etag, landed.content_md5)
            elif exc.code == "SourceConditionNotMet":
                raise SourceChangedError(f"{listed.name}: the source changed since it was listed; run again") from exc
            else:
                raise
        ctx.progress.advanced(row.rel, listed.size, 0)
        return FileResult(row.rel, row.blob, listed.size, FileStatus.TRANSFERRED, bytes_sent=listed.size,
                          reason="copied by the service", etag=result.etag, content_md5=listed.content_md5,
                          url=blob_url(ctx.store.container_url, row.blob), version_id=result.version_id)

    async def _copy_staged(self, row: FileRow, props: BlobProperties, conditions: Conditions, block: int
                           ) -> FileResult:
        ctx = self.ctx
        nonce, block = self._resume_or_start(row, props, block)
        writer = ctx.store.writer(row.blob, nonce)
        tokens, expected = part_layout(writer, props.size, block)
        held: set[str] = set()
        if nonce == row.nonce:  # resumed: the parts the store holds already are not staged again
            listing = await ctx.request(lambda: writer.parts())
            held = {p.token for p in listing.staged if expected.get(p.token) == p.size}
        tags = await source_tags(ctx.config, self.source, ctx, props.name)
        headers = replace(copy_headers(ctx.config, props, ctx.store.capabilities), tags=tags)
        parts = ServiceParts(ctx, row, writer, await self.source.copy_source(props.name, props.etag or None,
                                                                            ctx.store.location), headers, conditions)
        todo = [r for r in block_ranges(props.size, block) if tokens[r[0]] not in held]
        ctx.progress.advanced(row.rel, props.size - sum(length for _, _, length in todo), 0)
        await parts.stage(todo)
        result = await commit_checked(ctx, writer, row.blob, [(t, False) for t in tokens], expected, headers,
                                      parts.foreign.conditions)
        note = f"copied by the service; resumed: {props.size - parts.sent} bytes were staged already" \
            if parts.sent < props.size else "copied by the service"
        return FileResult(row.rel, row.blob, props.size, FileStatus.TRANSFERRED, bytes_sent=min(parts.sent, props.size),
                          reason=note, etag=result.etag, content_md5=headers.content_md5,
                          url=blob_url(ctx.store.container_url, row.blob), version_id=result.version_id)

    def _resume_or_start(self, row: FileRow, props: BlobProperties, block: int) -> tuple[str, int]:
        """The write a killed run began, if it was of this very version; else a new one, journaled before the
        first part is staged (the journal's etag is the source version's)."""
        if (row.nonce and row.block_size and (row.etag or "").strip('"') == props.etag.strip('"')
                and row.state in (FileState.ACTIVE, FileState.FAILED)):
            return row.nonce, row.block_size
        nonce = new_nonce()
        self.ctx.journal.start_file(row.id, nonce=nonce, block_size=block, n_blocks=block_count(props.size, block),
                                    size=props.size, mtime_ns=destination_mtime_ns(props), inode=0, reset=True,
                                    etag=props.etag)
        self.ctx.journal.flush()
        return nonce, block

    async def _through_here(self, row: FileRow, listed: BlobProperties, conditions: Conditions) -> FileResult:
        """The source's bytes read here and uploaded: blocks with their checks, the whole MD5 compared with the
        source's, resumable like a file."""
        props = await self._stat_source(listed)
        src = BlobSource(self.ctx, self.source, props, asyncio.get_running_loop())
        headers = replace(copy_headers(self.ctx.config, props, self.ctx.store.capabilities),
                          tags=await source_tags(self.ctx.config, self.source, self.ctx, props.name))
        result = await FileUploader(self.ctx).upload_source(row, src, headers=headers,
                                                            conditions=conditions, expected_md5=props.content_md5)
        why = self.fallback or "--s2s-via-client"
        return FileResult(result.rel, result.blob, result.size, result.status, result.bytes_sent,
                          "; ".join(filter(None, [result.reason, f"through this machine ({why})"])),
                          result.exit_code, result.bytes_delta, result.etag, result.content_md5, result.url,
                          result.version_id)


class ServiceParts:
    """A staged copy's parts, each read by the destination's service from the source's URL; parts another writer
    left are cleared once for the whole copy (commit.ForeignParts), or, with `clear=False` (a split file's range),
    a refusal fails the copy."""

    def __init__(self, ctx: EngineContext, row: FileRow, writer: ChunkedWriter, source: CopySource,
                 headers: BlobHeaders, conditions: Conditions, *, clear: bool = True) -> None:
        self.ctx, self.row, self.writer, self.source = ctx, row, writer, source
        self.foreign = ForeignParts(ctx, writer, headers, conditions, clear=clear)
        self.sent = 0

    async def stage(self, ranges: list[tuple[int, int, int]]) -> None:
        await for_each(ranges, self._one, self.ctx.config.max_concurrency)

    async def _one(self, part: tuple[int, int, int]) -> None:
        i, offset, length = part
        await self.foreign.stage(lambda: self.ctx.request(lambda: self.writer.stage_from(i, self.source, offset,
                                                                                         length)))
        self.ctx.journal.block_done(self.row.id, i, length, "")
        self.sent += length
        self.ctx.progress.advanced(self.row.rel, length, 0)


class BlobSource:
    """A blob of another store read as an upload's source: ranges of the one version listed (If-Match), each
    checked against the MD5 the service computes of it where it does, read from a worker thread."""

    def __init__(self, ctx: EngineContext, store: Store, props: BlobProperties,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._ctx, self._store, self._props, self._loop = ctx, store, props, loop
        self.path = PurePosixPath(props.name)
        self.opened = FileIdentity(props.size, destination_mtime_ns(props), 0)

    def identity(self) -> FileIdentity:
        return self.opened  # a change is the version's: every read is pinned to it

    def read_into(self, buf: memoryview, offset: int) -> None:
        asyncio.run_coroutine_threadsafe(self._read(buf, offset), self._loop).result()

    def read_all(self, size: int) -> bytes:
        buf = bytearray(size)
        self.read_into(memoryview(buf), 0)
        return bytes(buf)

    def read_all_cached(self, size: int) -> bytearray | None:
        return None  # never on the event loop: a read is a request

    async def _read(self, buf: memoryview, offset: int) -> None:
        props, store = self._props, self._store
        try:  # hashed here: this runs for a thread of the I/O pool that waits for it
            await self._ctx.request(lambda: read_checked(store, None, props.name, offset, buf, props.etag or None))
        except ConflictError as exc:
            raise SourceChangedError(f"{props.name}: the source changed while it was being copied") from exc
