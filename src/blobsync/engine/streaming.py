"""Writes an object whose length is not known up front (chunks from an iterator, a file object being written):
block-size parts staged as they fill, one commit at the end, nothing visible before it."""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import replace

from blobsync.backends.base import BlobHeaders, Buffer, ChunkedWriter, Conditions, PartCheck
from blobsync.checksums import choose_check
from blobsync.engine.blocks import new_nonce
from blobsync.engine.commit import ForeignParts, commit_checked
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import crc64_metadata, new_md5, part_digests
from blobsync.engine.tasks import cancel_all, in_thread
from blobsync.engine.upload import put_once, written
from blobsync.errors import UsageError
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")
HASH_AHEAD = 4  # blocks queued for the whole MD5 before a write waits for it


class StreamWriter:
    """One object written as its bytes come: each full block is staged at once (a buffer of the memory budget
    while it is in flight; the request path's limit and retries), with the check the store verifies; the
    whole MD5 is kept along the way and stored as the object's Content-MD5 by the one commit, which `finish`
    makes and verifies. `abort` (or an error) leaves no object: nothing was committed."""

    def __init__(self, ctx: EngineContext, blob: str, headers: BlobHeaders, conditions: Conditions) -> None:
        ctx.store.check_name(blob)
        self.ctx, self.blob, self.headers, self.conditions = ctx, blob, headers, conditions
        self.block_size = ctx.config.block_size
        self.md5 = new_md5()
        self.size = 0
        # The block begun by writes smaller than a block: one buffer of a block's size for the writer's life, its
        # first `_filled` bytes in use (a bytearray grown and cleared each block was freed and faulted in again).
        self._buf = bytearray()
        self._filled = 0
        self._writer: ChunkedWriter | None = None
        self._tokens: list[str] = []
        self._lengths: dict[str, int] = {}
        self._crcs: list[int | None] = []  # each part's CRC64: the whole blob's is composed of them
        self._hashed: collections.deque[asyncio.Future[None]] = collections.deque()  # MD5 steps queued in the lane
        self._tasks: set[asyncio.Task[None]] = set()
        self._check = choose_check(ctx.store.capabilities.part_checks, ctx.config.block_check)
        self._lane: int | None = None
        self._foreign: ForeignParts | None = None  # parts another writer left, cleared once for the stream
        self.closed = False

    async def write(self, data: Buffer) -> int:
        """Take `data` (copied: the caller may reuse its buffer); a block that fills is staged."""
        if self.closed:
            raise UsageError(f"{self.blob}: write to a closed blob writer")
        try:
            view = memoryview(data).cast("B")
        except TypeError:  # a str, an int...: said before anything of it is staged; the write is aborted
            raise UsageError(f"{self.blob}: a chunk of {type(data).__name__}, where bytes-like data is written "
                             "(encode text first)") from None
        done, block = 0, self.block_size
        if self._filled:  # the block begun by earlier writes is filled first
            done = self._fill(view[:block - self._filled])
            if self._filled == block:
                await self._stage(memoryview(self._buf))
                self._filled = 0
        while len(view) - done >= block:  # whole blocks go from the caller's memory (one copy, into the block)
            await self._stage(view[done:done + block])
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

    async def _stage(self, block: memoryview) -> None:
        failed = [t for t in self._tasks if t.done() and t.exception() is not None]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]
        ctx = self.ctx
        limit = ctx.store.capabilities.max_parts
        if len(self._tokens) >= limit:
            raise UsageError(f"{self.blob}: more than {limit} blocks: raise block_size for a stream this large")
        buf = await ctx.memory.buffer(len(block))
        view = memoryview(buf)[:len(block)]
        view[:] = block
        if self._lane is None:  # this object's MD5: one lane (in order) from the first block to the commit
            self._lane = ctx.hashing.take()
        # The whole MD5 runs in its lane (in order) beside the writes: a write waits only when HASH_AHEAD blocks are
        # queued there, not for each block's step (the caller's thread crossed to the loop and back for each).
        hashed = asyncio.get_running_loop().run_in_executor(ctx.hashing.pool(self._lane), self.md5.update, view)
        self._hashed.append(hashed)
        while len(self._hashed) > HASH_AHEAD:
            await self._hashed.popleft()
        self.size += len(view)
        if self._writer is None:
            self._writer = ctx.store.writer(self.blob, new_nonce())
        writer, index = self._writer, len(self._tokens)
        token = writer.token(index)
        self._tokens.append(token)
        self._lengths[token] = len(view)
        self._crcs.append(None)

        async def stage() -> None:
            try:  # in a thread: an MD5 of a block (the emulator's check) would stall the loop ~10 ms
                check, self._crcs[index] = await in_thread(ctx.io_pool, part_digests, view, self._check)
                await self._put_part(writer, index, view, check)
                ctx.progress.advanced(self.blob, len(view), len(view))
            finally:  # the buffer goes back once both the part and the MD5 are done with it
                if hashed.done():
                    ctx.memory.release(buf)
                else:
                    hashed.add_done_callback(lambda _: ctx.memory.release(buf))

        task = asyncio.ensure_future(stage())
        self._tasks.add(task)
        # A failed stage stays in the set for finish() to raise; a cancelled one (the writer aborted) is dropped.
        task.add_done_callback(lambda t: self._tasks.discard(t) if t.cancelled() or t.exception() is None else None)

    async def _put_part(self, writer: ChunkedWriter, index: int, view: memoryview, check: PartCheck | None) -> None:
        if self._foreign is None:
            self._foreign = ForeignParts(self.ctx, writer, self.headers, self.conditions)
        await self._foreign.stage(lambda: self.ctx.request(lambda: writer.stage(index, view, check)))

    async def finish(self) -> FileResult:
        """Stage what is left, commit in order with the whole MD5, verify, and say what landed."""
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
        ctx = self.ctx
        if self._writer is None and self._filled <= ctx.config.single_put_limit:
            data = bytes(self._buf[:self._filled])
            self.md5.update(data)
            self.size = len(data)
            return written(await put_once(ctx, self.blob, self.blob, data, self.md5.digest(), self.headers,
                                          self.conditions))
        if self._filled or not self._tokens:
            await self._stage(memoryview(self._buf)[:self._filled])
            self._filled = 0
        await asyncio.gather(*list(self._tasks))
        await asyncio.gather(*self._hashed)
        self._hashed.clear()
        writer, md5 = self._writer, self.md5.digest()
        assert writer is not None
        crc = crc64_metadata([(c, self._lengths[t]) for c, t in zip(self._crcs, self._tokens, strict=True)], md5)
        headers = replace(self.headers, content_md5=md5, metadata={**self.headers.metadata, **crc})
        conditions = self._foreign.conditions if self._foreign is not None else self.conditions
        result = await commit_checked(ctx, writer, self.blob, [(t, False) for t in self._tokens], self._lengths,
                                      headers, conditions)
        return FileResult(self.blob, self.blob, self.size, FileStatus.TRANSFERRED, bytes_sent=self.size,
                          etag=result.etag, content_md5=md5, url=blob_url(ctx.store.container_url, self.blob),
                          version_id=result.version_id)

    async def abort(self) -> None:
        """Give up: no commit, the staged parts dropped where the store can."""
        self.closed = True
        self._give_back()
        await cancel_all(list(self._tasks))
        if self._foreign is not None:
            await self._foreign.settle()
        self._buf, self._filled = bytearray(), 0  # a new one: a view of the old may live on in the error raised
        if self._writer is not None:
            writer = self._writer
            try:
                await self.ctx.request(writer.abort)
            except Exception as exc:  # best effort: uncommitted parts expire on their own
                log.debug("%s: abort: %s", self.blob, exc)
