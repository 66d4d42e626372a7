"""The one ranged read of a blob: each range a checked GET (engine/fetching.read_checked) into its sink (a partial
file, a buffer in memory), in parallel under the request window, hashed in order when the whole MD5 is wanted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, TypeVar

from blobsync.backends.base import Pieces, Store
from blobsync.checksums import crc64_int
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import Digest, crc64_digest, feed, md5_of
from blobsync.engine.tasks import cancel_all, gather_or_cancel, in_thread, raise_first_failure
from blobsync.errors import ChecksumMismatchError, ConflictError, CorruptedInTransitError, UnpinnedReadError
from blobsync.local.target import PartFile, current_boot_id

if TYPE_CHECKING:
    from blobsync.engine.digest import Md5

T = TypeVar("T")
log = logging.getLogger("blobsync")
SYNC_INTERVAL = 2.0  # seconds between fdatasyncs of a partial download (what a power cut can cost)

# One checked ranged GET into a view: (offset, view) -> anything. The caller binds the blob and its version.
GetRange = Callable[[int, memoryview], Awaitable[object]]
# One GET over several blocks, into pieces: (offset, length, pieces) -> anything (Store.read_span, bound).
GetSpan = Callable[[int, int, Pieces], Awaitable[object]]
Range = tuple[int, int, int]  # index, offset, length
# Blocks one GET may span when nothing is hashed in order: 8 MiB blocks -> 64 MiB a request, as many requests in
# flight as before. Measured against Azurite (1 GiB down): fewer, longer GETs cost the server and the client less
# per byte; each block is still stored and journaled on its own as soon as it is full.
SPAN_BLOCKS = 8


async def read_checked(store: Store, pool: ThreadPoolExecutor | None, blob: str, offset: int, view: memoryview,
                       etag: str | None, *, need_md5: bool = False) -> bytes | None:
    """One ranged GET into `view` of the version `etag`, verified against the range MD5 the service sends for
    small ranges: a mismatch was damage in transit, raised as a transient error so that the request path fetches it
    again. Returns the MD5 of the bytes when it was computed (or `need_md5` asks for it); a large range is hashed
    in `pool` (None: here, for a caller that is itself a thread of that pool waiting on this)."""
    check = 0 < len(view) <= store.capabilities.range_md5_max
    got = await store.read_into(blob, offset, view, etag, range_md5=check)
    if got.range_md5 is None and not need_md5:
        return None
    digest = md5_of(view) if pool is None or len(view) <= 1 << 20 else await in_thread(pool, md5_of, view)
    whole_blob = offset == 0 and len(view) == got.size
    if got.range_md5 is not None and digest != got.range_md5 and not (whole_blob
                                                                      and got.range_md5 == got.content_md5):
        # (For a range that is the whole blob, Azurite answers with the stored Content-MD5: a mismatch with
        # that may be a wrong stored MD5, not damage; the whole-file check decides, after one refetch.)
        raise CorruptedInTransitError(f"get blob {blob!r}: bytes {offset}-{offset + len(view) - 1} arrived "
                                      "damaged (their MD5 differs from the service's)")
    return digest


class Refetches:
    """The rule of a whole read whose digest differed from the stored one (damage in transit in a range too large
    for a per-range check, or a wrong stored digest): read again until the same bytes come twice (then the stored
    digest is what is wrong), at most `limit` times. Every whole read keeps it: a download, a get, a split file."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[bytes] = set()  # digests of whole reads that differed from the stored one

    def after(self, digest: bytes | None) -> bool:
        """Whether a read whose bytes had `digest` is worth running again (and count it)."""
        if digest is None or digest in self.seen or len(self.seen) >= self.limit:
            return False
        self.seen.add(digest)
        return True


async def read_whole(ctx: EngineContext, blob: str, read: Callable[[frozenset[bytes]], Awaitable[T]],
                     new_version: Callable[[], Awaitable[bool]]) -> T:
    """A whole read of a blob (a download, a get), run again where that helps: its MD5 differed from the stored
    one (damage in transit in a range too large for a per-range MD5, or a wrong stored MD5) until the same bytes
    come twice, the digests seen so far passed to `read`; or the blob changed during it (If-Match refused), once,
    after `new_version()` took the new version (False: none is there, the refusal stands)."""
    again = Refetches(ctx.config.max_retries)
    changed = False
    while True:
        try:
            return await read(frozenset(again.seen))
        except ChecksumMismatchError as exc:
            if not again.after(exc.digest):
                raise
            ctx.requests.retrier.note(exc)
        except ConflictError:
            if changed or not await new_version():
                raise
            changed = True
            log.info("%s changed while it was read; reading it again", blob)


def span_reader(store: Store, blob: str, etag: str | None, block_size: int) -> GetSpan | None:
    """The span read of `blob` (version `etag`) where the store has one and no per-range MD5 is lost by it
    (blocks too large for the service to send one)."""
    caps = store.capabilities
    if not caps.spans or block_size <= caps.range_md5_max:
        return None
    return lambda offset, length, pieces: store.read_span(blob, offset, length, pieces, etag)


class Sink(Protocol):
    """Where the ranges of one read land."""

    def target(self, offset: int, length: int) -> memoryview | None:
        """The view a range is read straight into, or None: into a pooled buffer, then handed to `landed`."""

    async def landed(self, idx: int, offset: int, view: memoryview) -> None:
        """A range has arrived (in `view`): store it."""

    def stored(self, offset: int, length: int) -> Iterable[bytes]:
        """The bytes of a range that was there before this read (a resumed download), for the in-order hash."""

    async def drain(self) -> None:
        """Wait for what the sink still does in the background."""


class MemorySink:
    """A buffer the caller holds, for the blob's bytes from `base` on: each range is read straight into its place."""

    def __init__(self, view: memoryview, base: int = 0) -> None:
        self.view, self.base = view, base

    def target(self, offset: int, length: int) -> memoryview:
        return self.view[offset - self.base:offset - self.base + length]

    async def landed(self, idx: int, offset: int, view: memoryview) -> None:
        return None

    def stored(self, offset: int, length: int) -> Iterable[bytes]:
        return (bytes(self.target(offset, length)),)

    async def drain(self) -> None:
        return None


class FileSink:
    """A partial file: each range written with pwrite and (with a journal row) journaled as written, the file
    made durable now and then."""

    def __init__(self, ctx: EngineContext, part: PartFile, row_id: int | None) -> None:
        self.ctx, self.part, self.row_id = ctx, part, row_id
        self.boot = current_boot_id()
        self.unsynced: list[int] = []  # ranges journaled as written in this boot, not yet fsynced
        self.syncing: list[asyncio.Task[None]] = []
        self.last_sync = asyncio.get_running_loop().time()

    def target(self, offset: int, length: int) -> None:
        return None

    async def landed(self, idx: int, offset: int, view: memoryview) -> None:
        await in_thread(self.ctx.io_pool, self.part.write_view, view, offset)
        if self.row_id is None:
            return
        self.ctx.journal.block_done(self.row_id, idx, len(view), "", durable=True, boot=self.boot)
        # Periodically, not per range: an fdatasync per 8 MiB would cost more than the write. Until then a killed
        # process loses nothing (the page cache holds the data); a power cut loses these ranges, and the journal
        # says so (their boot).
        self.unsynced.append(idx)
        loop = asyncio.get_running_loop()
        if loop.time() - self.last_sync >= SYNC_INTERVAL and (not self.syncing or self.syncing[-1].done()):
            self.last_sync = loop.time()
            self.syncing.append(asyncio.create_task(self._sync(self.unsynced[:])))
            self.unsynced.clear()

    def stored(self, offset: int, length: int) -> Iterator[bytes]:
        return self.part.chunks(offset, length)

    async def _sync(self, indexes: list[int]) -> None:
        await in_thread(self.ctx.io_pool, self.part.sync)
        assert self.row_id is not None
        self.ctx.journal.ranges_synced(self.row_id, indexes)

    async def drain(self) -> None:
        await asyncio.gather(*self.syncing, return_exceptions=True)
        for task in self.syncing:
            task.result()


class RangeFetch:
    """Fetches the ranges of one blob not yet in the sink, in parallel, each into the sink's view or a pooled
    buffer; hashes them in order as they become available (a buffer goes back once stored and hashed)."""

    def __init__(self, ctx: EngineContext, rel: str, blob: str, etag: str | None, ranges: Iterable[Range],
                 sink: Sink, whole: Md5 | None, *, crc64: bool = False) -> None:
        self.ctx, self.rel, self.sink, self.whole = ctx, rel, sink, whole
        # With `crc64`, each range's CRC64 as it lands (in parallel, any order): composed by `crc64()` at the end.
        self.crcs: dict[int, tuple[int, int]] | None = {} if crc64 else None
        self.ranges = list(ranges)
        if not etag and len(self.ranges) > 1:
            raise UnpinnedReadError(
                f"{blob}: the service named no version (ETag) of it, so a read in {len(self.ranges)} ranges could "
                "mix two versions of the blob: refused", hint="read it in one request (a block size of at least "
                "its size), or fix the server or proxy that drops the ETag")
        self.get: GetRange = lambda offset, view: read_checked(ctx.store, ctx.io_pool, blob, offset, view, etag)
        self.buffer_size = max((length for _, _, length in self.ranges), default=0)  # pooled buffers: one size
        # several blocks a GET: only when none waits for a hash
        self.span = span_reader(ctx.store, blob, etag, self.buffer_size) if whole is None else None
        loop = asyncio.get_running_loop()
        # A fetched range waits here (its view, and its pooled buffer if any) until hashed in order; None: it was
        # in the sink already.
        self.results: dict[int, asyncio.Future[tuple[memoryview, BlockBuffer | None] | None]] = {
            idx: loop.create_future() for idx, _, _ in self.ranges}
        self.window = Window(lambda: ctx.limiter.limit)
        self.sent = 0
        self.pool: ThreadPoolExecutor | None = None  # the hash lane, while the whole MD5 is fed

    async def run(self, done: set[int] | frozenset[int] = frozenset()) -> int:
        """Fetch every range not in `done`; returns the bytes fetched."""
        if self.whole is None:
            return await self._run(done)
        with self.ctx.hashing.lane() as self.pool:  # this blob's MD5: one thread, in order
            return await self._run(done)

    async def _run(self, done: set[int] | frozenset[int]) -> int:
        if self.span is not None:
            return await self._run_spans(done)
        ctx = self.ctx
        tasks: set[asyncio.Task[None]] = set()
        hasher = asyncio.create_task(self._hash_in_order()) if self.whole is not None else None
        try:
            for idx, offset, length in self.ranges:
                if idx in done:
                    self.results[idx].set_result(None)
                    ctx.progress.advanced(self.rel, length, 0)
                    continue
                raise_first_failure(tasks)
                await self.window.acquire()
                view, buf = self.sink.target(offset, length), None
                if view is None:
                    buf = await ctx.memory.buffer(self.buffer_size)
                    view = memoryview(buf)[:length]
                tasks.add(asyncio.create_task(self._fetch(idx, offset, view, buf)))
            if tasks:
                await gather_or_cancel(tasks)
            if hasher is not None:
                await hasher
            await self.sink.drain()
        except BaseException:
            await self._abandon([*tasks, *([hasher] if hasher else [])])
            raise
        return self.sent

    async def _run_spans(self, done: set[int] | frozenset[int]) -> int:
        todo = []
        for idx, offset, length in self.ranges:
            if idx in done:
                self.ctx.progress.advanced(self.rel, length, 0)
            else:
                todo.append((idx, offset, length))
        # Long spans, but never fewer of them than requests may be in flight (a mid-sized blob keeps its parallelism).
        per = max(1, min(SPAN_BLOCKS, -(-len(todo) // max(1, self.ctx.limiter.limit))))
        tasks: set[asyncio.Task[None]] = set()
        try:
            for span in _spans(todo, per):
                raise_first_failure(tasks)
                await self.window.acquire()
                tasks.add(asyncio.create_task(self._fetch_span(span)))
            if tasks:
                await gather_or_cancel(tasks)
            await self.sink.drain()
        except BaseException:
            await cancel_all(list(tasks))
            await asyncio.gather(self.sink.drain(), return_exceptions=True)
            raise
        return self.sent

    async def _fetch_span(self, span: list[Range]) -> None:
        assert self.span is not None
        pieces = _SpanPieces(self, span)
        try:
            await self.ctx.request(pieces.attempt)
            await gather_or_cancel(pieces.storing)
        finally:
            await cancel_all(pieces.storing)
            pieces.release()
            self.window.release()

    async def _store(self, idx: int, offset: int, view: memoryview, buf: BlockBuffer | None) -> None:
        """A full block of a span: into the sink, then its pooled buffer (if it had one) back to the pool."""
        n = len(view)
        try:
            await self._crc(idx, view)
            await self.sink.landed(idx, offset, view)
        finally:
            self._release(view, buf)
        self.ctx.progress.advanced(self.rel, n, n)
        self.sent += n

    async def _crc(self, idx: int, view: memoryview) -> None:
        if self.crcs is not None:
            n = len(view)
            self.crcs[idx] = (await in_thread(self.ctx.io_pool, crc64_int, view) if n > 1 << 20 else crc64_int(view),
                              n)

    async def crc64(self) -> Digest:
        """The CRC64 of the whole read: the ranges' as they landed, those in the sink before it read back."""
        assert self.crcs is not None
        crcs = self.crcs

        def compose() -> Digest:
            parts = []
            for idx, offset, length in self.ranges:
                got = crcs.get(idx)
                if got is None:  # in the sink before this read (a resumed download)
                    crc = 0
                    for chunk in self.sink.stored(offset, length):
                        crc = crc64_int(chunk, crc)
                    got = (crc, length)
                parts.append(got)
            return crc64_digest(parts)

        return await in_thread(self.ctx.io_pool, compose)

    async def _abandon(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop every fetch and the hasher; buffers fetched but never hashed go back to the pool."""
        await cancel_all(tasks)
        await asyncio.gather(self.sink.drain(), return_exceptions=True)
        for future in self.results.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                got = future.result()
                if got is not None:
                    self._release(*got)

    def _release(self, view: memoryview, buf: BlockBuffer | None) -> None:
        if buf is not None:
            view.release()
            self.ctx.memory.release(buf)

    async def _fetch(self, idx: int, offset: int, view: memoryview, buf: BlockBuffer | None) -> None:
        ctx = self.ctx
        try:
            await ctx.request(lambda: self.get(offset, view))
            await self._crc(idx, view)
            await self.sink.landed(idx, offset, view)
        except BaseException:
            self._release(view, buf)
            self.window.release()
            # The failure itself surfaces through this task; the in-order hasher just stops.
            if idx in self.results:
                self.results[idx].cancel()
            raise
        ctx.progress.advanced(self.rel, len(view), len(view))
        self.sent += len(view)
        if self.whole is None:
            self.window.release()
            self._release(view, buf)
            self.results[idx].set_result(None)
        else:
            # The window slot stays taken until the range is hashed: fetching may run at most a window ahead of
            # the in-order MD5, so the hash (the serial part) is never left with a long backlog to work through
            # alone once the last byte has arrived, and fewer buffers are needed.
            self.results[idx].set_result((view, buf))

    async def _hash_in_order(self) -> None:
        # Each range is queued on the one hash thread as soon as it and all before it are here, without waiting
        # for the previous one to be hashed: the thread's queue keeps the order, and the thread never waits for
        # the event loop between two ranges.
        assert self.whole is not None
        whole, pool = self.whole, self.pool
        assert pool is not None
        hashing: list[asyncio.Future[None]] = []
        try:
            for idx, offset, length in self.ranges:
                got = await self.results[idx]
                del self.results[idx]  # from here on this buffer is the hasher's to release
                if got is None:  # in the sink before this read
                    chunks = self.sink.stored(offset, length)
                    hashing.append(asyncio.ensure_future(in_thread(pool, feed, whole, chunks)))
                else:
                    hashing.append(self._hash_range(*got))
                while hashing and hashing[0].done():
                    hashing.pop(0).result()
            await gather_or_cancel(hashing)
        except BaseException:
            await cancel_all(hashing)
            raise

    def _hash_range(self, view: memoryview, buf: BlockBuffer | None) -> asyncio.Future[None]:
        # Off the event loop: hashing 8 MiB takes ~10 ms, long enough to stall every other request.
        assert self.whole is not None and self.pool is not None
        hashed = asyncio.ensure_future(in_thread(self.pool, self.whole.update, view))

        def done(_: object) -> None:  # also when cancelled before it started: the buffer is never lost
            self._release(view, buf)
            self.window.release()

        hashed.add_done_callback(done)
        return hashed


def _spans(todo: list[Range], per: int) -> Iterator[list[Range]]:
    """Consecutive blocks in runs of up to `per` (a gap, a block present already, starts a new run)."""
    run: list[Range] = []
    for r in todo:
        if run and (len(run) == per or r[0] != run[-1][0] + 1):
            yield run
            run = []
        run.append(r)
    if run:
        yield run


class _SpanPieces:
    """A span's blocks as the pieces of one GET: each its place in the sink (a caller's buffer) or a pooled buffer,
    stored as soon as it is full. A retried GET starts at the first block not yet full (reusing its buffer); the
    blocks before it are stored already."""

    def __init__(self, fetch: RangeFetch, span: list[Range]) -> None:
        self.fetch, self.span = fetch, span
        self.filled = 0  # blocks of the span full (stored, or being stored)
        self.current: tuple[memoryview, BlockBuffer | None] | None = None  # the block being filled
        self.storing: list[asyncio.Task[None]] = []

    def attempt(self) -> Awaitable[object]:
        assert self.fetch.span is not None
        _, offset, _ = self.span[self.filled]
        return self.fetch.span(offset, sum(length for _, _, length in self.span[self.filled:]), self)

    async def next(self) -> memoryview | None:
        if self.filled == len(self.span):
            return None
        if self.current is None:
            _, offset, length = self.span[self.filled]
            view = self.fetch.sink.target(offset, length)
            if view is not None:
                self.current = (view, None)
            else:
                buf = await self.fetch.ctx.memory.buffer(self.fetch.buffer_size)
                self.current = (memoryview(buf)[:length], buf)
        return self.current[0]

    def full(self, view: memoryview) -> None:
        assert self.current is not None and view is self.current[0]
        idx, offset, _ = self.span[self.filled]
        self.storing.append(asyncio.ensure_future(self.fetch._store(idx, offset, *self.current)))
        self.current = None
        self.filled += 1

    def release(self) -> None:
        """The buffer of a block left half-filled (the GET failed for good) goes back to the pool."""
        if self.current is not None:
            self.fetch._release(*self.current)
            self.current = None
