"""A file's chunked upload, step by step: what the store holds already, read and hash (the blocks through the one
chunk loop, engine/chunks.py), commit, verify, journal."""

from __future__ import annotations

import functools
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor

from blobsync.backends.base import BlockCheck, PutResult
from blobsync.checksums import choose_check, require_crc64
from blobsync.engine.blocks import block_ranges
from blobsync.engine.budget import BlockBuffer
from blobsync.engine.chunks import BlockWrite, ChunkLoop, check_expected, commit_write, prior_notes
from blobsync.engine.commit import ForeignParts
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import committed_record
from blobsync.engine.digest import BlockDigests, block_digests
from blobsync.engine.tasks import in_thread
from blobsync.errors import SourceChangedError
from blobsync.local.files import Source
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")


def read_block(src: Source, view: memoryview, offset: int, unchanged: bytes | None = None,
               check: BlockCheck | None = BlockCheck.MD5) -> BlockDigests:
    """Fill `view` from the file and return its digests (in a worker thread)."""
    src.read_into(view, offset)
    return block_digests(view, unchanged, check)


class BlockUploader:
    """Runs one BlockWrite: plan -> read and hash -> stage -> commit -> verify -> journal."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        if ctx.config.block_check is BlockCheck.CRC64:
            require_crc64()  # asked for by name: refused now, before anything moves, if it is not installed

    @functools.cached_property
    def check(self) -> BlockCheck | None:
        """The check each block carries; chosen on first use, as a CRC64 loads awscrt (~75 ms), which a job of
        small files never needs."""
        return choose_check(self.ctx.store.capabilities.part_checks, self.ctx.config.block_check)

    async def run(self, w: BlockWrite, src: Source, resume: bool) -> FileResult:
        w.foreign = ForeignParts(self.ctx, w.writer, w.plan.headers, w.plan.conditions)
        if resume:
            await self._find_staged(w)
        md5 = await self._stage_all(w, src)
        check_expected(w.plan, md5)
        return self._record(w, await commit_write(self.ctx, w, md5), md5)

    async def stage_window(self, w: BlockWrite, src: Source) -> None:
        """Read, check and stage blocks [w.first, w.last) as `run` does (resume, delta), with no whole MD5 and no
        commit: a split file's range task, whose file is hashed and committed by tasks of their own."""
        # Parts another writer left were cleared by the client before the ranges began: a clear here would drop
        # the other ranges' parts, so a refusal fails the range.
        w.foreign = ForeignParts(self.ctx, w.writer, w.plan.headers, w.plan.conditions, clear=False)
        await self._find_staged(w)
        await self._stage_blocks(w, src, None)

    async def _find_staged(self, w: BlockWrite) -> None:
        """The parts of this write the store holds already (a resumed upload sends only the others)."""
        ctx, ident = self.ctx, w.plan.identity
        assert w.row is not None  # a file's write: journaled
        listing = await ctx.request(lambda: w.writer.parts())
        # Parts of this write already committed (the commit landed, its answer was lost) are named again only
        # where a commit may keep parts of the current version; elsewhere they are sent again.
        found = ((True, listing.committed), (False, listing.staged)) if ctx.store.capabilities.keeps_parts \
            else ((False, listing.staged),)
        for committed, parts in found:
            for part in parts:
                if w.expected.get(part.token) == part.size:
                    w.present[part.token] = committed
        ctx.journal.start_file(w.row.id, nonce=w.nonce, block_size=w.block_size, n_blocks=len(w.tokens),
                               size=w.size, mtime_ns=ident.mtime_ns, inode=ident.inode, reset=False,
                               ctime_ns=ident.ctime_ns)

    async def _stage_all(self, w: BlockWrite, src: Source) -> bytes | None:
        """Read every block, stage the ones the store lacks, and hash the file in order; returns its MD5."""
        if not self.ctx.config.put_md5:
            return await self._stage_blocks(w, src, None)
        with self.ctx.hashing.lane() as lane:  # this file's MD5: one thread, in order; other files on others
            return await self._stage_blocks(w, src, lane)

    async def _stage_blocks(self, w: BlockWrite, src: Source, lane: ThreadPoolExecutor | None) -> bytes | None:
        chunks = ChunkLoop(self.ctx, w, lane)
        try:
            for idx, offset, length in itertools.islice(block_ranges(w.size, w.block_size), w.first, w.last):
                buf, view = await chunks.slot(length)
                chunks.put(idx, buf, view, await self._read_block(w, src, chunks, buf, view, idx, offset))
            md5 = await chunks.finish()
            if src.identity() != w.plan.identity:
                raise SourceChangedError(f"{src.path}: file changed while it was being uploaded; nothing committed")
        except BaseException:
            await chunks.cancel()
            raise
        return md5

    async def _read_block(self, w: BlockWrite, src: Source, chunks: ChunkLoop, buf: BlockBuffer, view: memoryview,
                          idx: int, offset: int) -> BlockDigests:
        """The block filled from the file in a worker thread, with its digests."""
        old = w.base.block_at(idx, len(view)) if w.base is not None else None
        try:
            # A block the store holds already (resume) is only read for the whole-file MD5 and the delta memory:
            # its own check would cost CPU for nothing.
            return await in_thread(self.ctx.io_pool, read_block, src, view, offset,
                                   old[1] if old is not None else None,
                                   self.check if w.tokens[idx] not in w.present else None)
        except BaseException:
            chunks.drop(buf)
            raise

    def _record(self, w: BlockWrite, result: PutResult, md5: bytes | None) -> FileResult:
        ctx, blob = self.ctx, w.plan.blob
        ctx.journal.remember_commit(ctx.store.container_url, blob, committed_record(
            w.block_size, result.etag, w.size, md5, list(zip(w.tokens, w.lengths(), w.digests, strict=True))))
        copied = w.prior.copied if w.prior is not None else 0
        notes = prior_notes(w)
        if w.delta:
            notes.append(f"delta: {w.delta} bytes of unchanged blocks reused")
        if copied:
            notes.append(f"incremental: {copied} bytes of unchanged blocks staged by the service from "
                         f"{w.prior.name if w.prior is not None else ''!r}")
        if w.reused - w.delta - copied:
            notes.append(f"resumed: {w.reused - w.delta - copied} bytes were already on the service")
        return FileResult(w.rel, blob, w.size, FileStatus.TRANSFERRED, bytes_sent=w.size - w.reused,
                          reason="; ".join(notes), bytes_delta=w.delta, bytes_copied=copied, etag=result.etag,
                          content_md5=md5,
                          url=blob_url(ctx.store.container_url, blob), version_id=result.version_id)

