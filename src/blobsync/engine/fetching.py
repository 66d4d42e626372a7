"""A blob's ranged download, step by step: fetch each missing range into a pooled buffer, write it in place,
hash the ranges in file order, and make the partial file durable now and then."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from blobsync.backends.base import BlobProperties
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import feed
from blobsync.engine.plan import block_ranges
from blobsync.engine.tasks import cancel_all, gather_or_cancel, in_thread, raise_first_failure
from blobsync.journal import FileRow
from blobsync.local.target import PartFile, current_boot_id

if TYPE_CHECKING:
    from blobsync.engine.digest import Md5

SYNC_INTERVAL = 2.0  # seconds between fdatasyncs of a partial download (what a power cut can cost)

# One checked ranged GET into a view: (offset, view) -> None. The downloader passes its own.
GetRange = Callable[[int, memoryview], Awaitable[object]]


class RangeFetch:
    """Fetches the ranges of one blob not yet on disk, in parallel, each straight into a pooled buffer; writes
    each with pwrite; hashes them in order as they become available (a buffer goes back once hashed)."""

    def __init__(self, ctx: EngineContext, row: FileRow, props: BlobProperties, part: PartFile,
                 whole: Md5 | None, block_size: int, get: GetRange) -> None:
        self.ctx = ctx
        self.row = row
        self.part = part
        self.whole = whole
        self.get = get
        self.ranges = list(block_ranges(props.size, block_size))
        self.block_size = block_size
        loop = asyncio.get_running_loop()
        # A fetched range waits here (its buffer) until hashed in order; None: it was on disk already.
        self.results: dict[int, asyncio.Future[BlockBuffer | None]] = {
            idx: loop.create_future() for idx, _, _ in self.ranges}
        self.window = Window(lambda: ctx.limiter.limit)
        self.sent = 0
        self.boot = current_boot_id()
        self.unsynced: list[int] = []  # ranges journaled as written in this boot, not yet fsynced
        self.syncing: list[asyncio.Task[None]] = []
        self.last_sync = loop.time()

    async def run(self, done: set[int]) -> int:
        """Fetch every range not in `done`; returns the bytes fetched."""
        ctx = self.ctx
        tasks: set[asyncio.Task[None]] = set()
        hasher = asyncio.create_task(self._hash_in_order()) if self.whole is not None else None
        try:
            for idx, offset, length in self.ranges:
                if idx in done:
                    self.results[idx].set_result(None)
                    ctx.progress.advanced(self.row.rel, length, 0)
                    continue
                raise_first_failure(tasks)
                await self.window.acquire()
                buf = await ctx.memory.buffer(self.block_size)
                tasks.add(asyncio.create_task(self._fetch(idx, offset, length, buf)))
            if tasks:
                await gather_or_cancel(tasks)
            if hasher is not None:
                await hasher
            await asyncio.gather(*self.syncing)
        except BaseException:
            await self._abandon([*tasks, *([hasher] if hasher else [])])
            raise
        return self.sent

    async def _abandon(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop every fetch and the hasher; buffers fetched but never hashed go back to the pool."""
        await cancel_all(tasks)
        await asyncio.gather(*self.syncing, return_exceptions=True)
        for future in self.results.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                got = future.result()
                if got is not None:
                    self.ctx.memory.release(got)

    async def _fetch(self, idx: int, offset: int, length: int, buf: BlockBuffer) -> None:
        ctx = self.ctx
        view = memoryview(buf)[:length]
        try:
            await ctx.request(lambda: self.get(offset, view))
            await in_thread(ctx.io_pool, self.part.write_view, view, offset)
        except BaseException:
            ctx.memory.release(buf)
            self.window.release()
            # The failure itself surfaces through this task; the in-order hasher just stops.
            if idx in self.results:
                self.results[idx].cancel()
            raise
        finally:
            view.release()
        ctx.journal.block_done(self.row.id, idx, length, "", durable=True, boot=self.boot)
        ctx.progress.advanced(self.row.rel, length, length)
        self.sent += length
        self._sync_now_and_then(idx)
        if self.whole is None:
            self.window.release()
            ctx.memory.release(buf)
            self.results[idx].set_result(None)
        else:
            # The window slot stays taken until the range is hashed: fetching may run at most a window ahead of
            # the in-order MD5, so the hash (the serial part) is never left with a long backlog to work through
            # alone once the last byte has arrived, and fewer buffers are needed.
            self.results[idx].set_result(buf)

    def _sync_now_and_then(self, idx: int) -> None:
        # Periodically, not per range: an fdatasync per 8 MiB would cost more than the write. Until then a killed
        # process loses nothing (the page cache holds the data); a power cut loses these ranges, and the journal
        # says so (their boot).
        self.unsynced.append(idx)
        loop = asyncio.get_running_loop()
        if loop.time() - self.last_sync >= SYNC_INTERVAL and (not self.syncing or self.syncing[-1].done()):
            self.last_sync = loop.time()
            self.syncing.append(asyncio.create_task(self._sync(self.unsynced[:])))
            self.unsynced.clear()

    async def _sync(self, indexes: list[int]) -> None:
        await in_thread(self.ctx.io_pool, self.part.sync)
        self.ctx.journal.ranges_synced(self.row.id, indexes)

    async def _hash_in_order(self) -> None:
        # Each range is queued on the one hash thread as soon as it and all before it are here, without waiting
        # for the previous one to be hashed: the thread's queue keeps the order, and the thread never waits for
        # the event loop between two ranges (~0.6 ms a hop, 128 hops a GiB).
        assert self.whole is not None
        whole, pool = self.whole, self.ctx.hash_pool
        hashing: list[asyncio.Future[None]] = []
        try:
            for idx, offset, length in self.ranges:
                buf = await self.results[idx]
                del self.results[idx]  # from here on this buffer is the hasher's to release
                if buf is None:  # on disk from an earlier run
                    chunks = self.part.chunks(offset, length)
                    hashing.append(asyncio.ensure_future(in_thread(pool, feed, whole, chunks)))
                else:
                    hashing.append(self._hash_range(buf, length))
                while hashing and hashing[0].done():
                    hashing.pop(0).result()
            await gather_or_cancel(hashing)
        except BaseException:
            await cancel_all(hashing)
            raise

    def _hash_range(self, buf: BlockBuffer, length: int) -> asyncio.Future[None]:
        # Off the event loop: hashing 8 MiB takes ~10 ms, long enough to stall every other request.
        assert self.whole is not None
        view = memoryview(buf)[:length]
        hashed = asyncio.ensure_future(in_thread(self.ctx.hash_pool, self.whole.update, view))

        def done(_: object) -> None:  # also when cancelled before it started: the buffer is never lost
            view.release()
            self.ctx.memory.release(buf)
            self.window.release()

        hashed.add_done_callback(done)
        return hashed
