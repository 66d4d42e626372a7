"""Writes an object whose length is not known up front (chunks from an iterator, a file object being written):
block-size parts staged as they fill, one commit at the end, nothing visible before it."""

from __future__ import annotations

import logging

from blobsync.backends.base import BlobHeaders, Buffer, Conditions
from blobsync.checksums import choose_check
from blobsync.engine.blocks import new_nonce
from blobsync.engine.chunks import BlockWrite, ChunkLoop, UploadPlan, commit_write, prior_notes
from blobsync.engine.commit import ForeignParts
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import md5_of
from blobsync.engine.prior import PriorBlocks, find_prior, prior_name
from blobsync.engine.tasks import in_thread
from blobsync.engine.upload import put_once, record_blocks, written
from blobsync.errors import UsageError
from blobsync.local.files import FileIdentity
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")
INLINE_MD5 = 1 << 20  # hashed on the loop up to this size: cheaper than the hand-off to a thread and back


class StreamWriter:
    """One object written as its bytes come: each full block goes through the engine's one chunk loop
    (engine/chunks.py: a buffer of the memory budget while it is in flight, its check computed beside its request,
    the whole MD5 in order in a lane, the request path's limit and retries); `finish` makes the one commit, with
    the whole MD5 as the Content-MD5, and verifies it. `abort` (or an error) leaves no object: nothing was
    committed."""

    def __init__(self, ctx: EngineContext, blob: str, headers: BlobHeaders, conditions: Conditions) -> None:
        ctx.store.check_name(blob)
        self.ctx, self.blob = ctx, blob
        self.block_size = ctx.config.block_size
        self._plan = UploadPlan(blob, FileIdentity(0, 0, 0), headers, conditions)
        # The block begun by writes smaller than a block: the writer's own buffer, outside the memory budget, as
        # it waits on the caller: open writers holding budget buffers while their callers wait on each other
        # could stall every one of them. One buffer for the writer's life, its first `_filled` bytes in use.
        self._buf = bytearray()
        self._filled = 0
        self._chunks: ChunkLoop | None = None  # from the first full block
        self._lane: int | None = None
        self._prior: tuple[PriorBlocks | None, str] | None = None  # an incremental write's earlier blob, once looked
        self._container_made = not ctx.config.create_container  # made (or there) before the first write request
        self.closed = False

    @property
    def size(self) -> int:
        """The bytes written so far."""
        return (self._chunks.w.size if self._chunks is not None else 0) + self._filled

    async def write(self, data: Buffer, borrowed: bool = False) -> int:
        """Take `data` (copied: the caller may reuse its buffer); a block that fills is staged. `borrowed`: its
        whole blocks are sent from `data` itself, outside the memory budget (the window still bounds them): `data`
        must keep its memory alive (a view of an object that owns it) and unchanged until finish or abort."""
        if self.closed:
            raise UsageError(f"{self.blob}: write to a closed blob writer")
        try:
            view = memoryview(data).cast("B")
        except TypeError:  # a str, an int...: said before anything of it is staged; the write is aborted
            raise UsageError(f"{self.blob}: a chunk of {type(data).__name__}, where bytes-like data is written "
                             "(encode text first)") from None
        if self._prior is None and self.ctx.config.blocks_from is not None:
            await self._find_prior()
        done, block = 0, self.block_size
        if self._filled:  # the block begun by earlier writes is filled first
            done = self._fill(view[:block - self._filled])
            if self._filled == block:
                await self._stage(memoryview(self._buf))
                self._filled = 0
        while len(view) - done >= block:  # whole blocks go from the caller's memory (one copy, into the block)
            await self._stage(view[done:done + block], borrowed)
            done += block
        self._fill(view[done:])
        return len(view)

    def _fill(self, part: memoryview) -> int:
        if len(part):
            if not self._buf:
                self._buf = bytearray(self.block_size)
            self._buf[self._filled:self._filled + len(part)] = part
            self._filled += len(part)
        return len(part)

    async def _find_prior(self) -> None:
        """The earlier blob an incremental write compares its blocks with (config.blocks_from), before the first
        byte is taken: the write takes its block size, so that the blocks line up."""
        assert self.ctx.config.blocks_from is not None
        prior, note = await find_prior(self.ctx, prior_name(self.ctx.config.blocks_from, None), None)
        if prior is not None:
            self.block_size = prior.block_size
        self._prior = (prior, f"incremental: sent whole: {note}" if note else "")

    def _loop(self) -> ChunkLoop:
        if self._chunks is None:
            ctx = self.ctx
            writer = ctx.store.writer(self.blob, new_nonce())
            w = BlockWrite(None, self._plan, "", writer, self.block_size, None, open_ended=True)
            w.foreign = ForeignParts(ctx, writer, self._plan.headers, self._plan.conditions)
            if self._prior is not None:
                w.prior, w.prior_note = self._prior
            if ctx.config.put_md5:  # this object's MD5: one lane (in order) from the first block to the commit
                self._lane = ctx.hashing.take()
            self._chunks = ChunkLoop(ctx, w, ctx.hashing.pool(self._lane) if self._lane is not None else None,
                                     choose_check(ctx.store.capabilities.part_checks, ctx.config.block_check))
        return self._chunks

    async def _make_container(self) -> None:
        """The container created where `create_container` asks (as a job does), once, before the first request
        that writes: an existing one is left as it is."""
        if not self._container_made:
            await self.ctx.request(self.ctx.store.create_container)
            self._container_made = True

    async def _stage(self, block: memoryview, borrowed: bool = False) -> None:
        await self._make_container()
        chunks = self._loop()
        limit = self.ctx.store.capabilities.max_parts
        if len(chunks.w.tokens) >= limit:
            raise UsageError(f"{self.blob}: more than {limit} blocks: raise block_size for a stream this large")
        if borrowed:
            await chunks.lend()
            chunks.put(chunks.w.grow(len(block)), None, block, None)
            return
        buf, view = await chunks.slot(len(block))
        view[:] = block
        chunks.put(chunks.w.grow(len(view)), buf, view, None)

    async def finish(self) -> FileResult:
        """Stage what is left, commit in order with the whole MD5 (unless `put_md5` is off) and the CRC64 composed
        from the blocks', verify, and say what landed."""
        if self.closed:
            raise UsageError(f"{self.blob}: the blob writer is closed")
        self.closed = True
        try:
            return await self._finish()
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self._lane is not None:
            self.ctx.hashing.give_back(self._lane)
            self._lane = None

    async def _finish(self) -> FileResult:
        ctx, plan = self.ctx, self._plan
        await self._make_container()
        if self._chunks is None and self._filled <= ctx.config.single_put_limit:
            data = bytes(memoryview(self._buf)[:self._filled])
            md5 = md5_of(data) if len(data) <= INLINE_MD5 else await in_thread(ctx.io_pool, md5_of, data)
            return written(await put_once(ctx, self.blob, self.blob, data, md5, plan.headers, plan.conditions))
        chunks = self._loop()
        if self._filled or not chunks.w.tokens:
            await self._stage(memoryview(self._buf)[:self._filled])
            self._filled = 0
        whole = await chunks.finish()
        w = chunks.w
        result = await commit_write(ctx, w, whole)
        if ctx.config.block_digests:
            await record_blocks(ctx, w, result.etag)
        copied = w.prior.copied if w.prior is not None else 0
        return FileResult(self.blob, self.blob, w.size, FileStatus.TRANSFERRED, bytes_sent=w.size - w.reused,
                          reason="; ".join(prior_notes(w)), bytes_copied=copied, etag=result.etag, content_md5=whole,
                          url=blob_url(ctx.store.container_url, self.blob), version_id=result.version_id)

    async def abort(self) -> None:
        """Give up: no commit, the staged parts dropped where the store can."""
        self.closed = True
        self._give_back()
        self._buf, self._filled = bytearray(), 0  # a new one: a view of the old may live on in the error raised
        if self._chunks is None:
            return
        await self._chunks.cancel()
        w = self._chunks.w
        if w.foreign is not None:
            await w.foreign.settle()
        try:
            await self.ctx.request(w.writer.abort)
        except Exception as exc:  # best effort: uncommitted parts expire on their own
            log.debug("%s: abort: %s", self.blob, exc)
