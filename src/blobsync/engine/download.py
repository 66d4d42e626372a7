"""Downloads one blob: a single GET when small, else parallel ranged GETs (If-Match) into a partial file."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import TypeVar

from blobsync.backends.base import RANGE_MD5_MAX, BlobProperties
from blobsync.config import CheckMd5, Overwrite
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.context import EngineContext
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.plan import block_count, block_ranges
from blobsync.engine.tasks import cancel_all, gather_or_cancel
from blobsync.errors import ChecksumMismatchError, ConflictError, CorruptedInTransitError, IntegrityError
from blobsync.journal import FileRow
from blobsync.local.target import PartFile, current_boot_id, part_path
from blobsync.report import FileResult, FileStatus

log = logging.getLogger("blobsync")
T = TypeVar("T")

_SYNC_INTERVAL = 2.0  # seconds between fdatasyncs of a partial download (what a power cut can cost)


class FileDownloader:
    """Downloads blobs of one job. Errors that concern only the file are raised as such; callers decide."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    async def download(self, row: FileRow, props: BlobProperties, target: Path) -> FileResult:
        cfg = self.ctx.config
        if os.path.lexists(target) and cfg.overwrite is not Overwrite.TRUE:
            if cfg.overwrite is Overwrite.FALSE:
                return self._skipped(row, props, "exists locally (--overwrite false)")
            newer = cfg.overwrite is Overwrite.IF_SOURCE_NEWER and os.stat(target).st_mtime_ns >= destination_mtime_ns(
                props)
            if newer:
                return self._skipped(row, props, "local file is as new or newer (--overwrite ifSourceNewer)")
            prompt = self.ctx.overwrite_prompt
            if cfg.overwrite is Overwrite.PROMPT and prompt is not None and not await prompt(
                    f"file {str(target)!r} exists"):
                return self._skipped(row, props, "exists locally (not overwritten, as answered)")
        seen: set[bytes] = set()  # digests of whole fetches that differed from the stored MD5
        changed = False
        while True:
            try:
                return await self._fetch(row, props, target, frozenset(seen))
            except ChecksumMismatchError as exc:
                # Damage in transit in a range too large for a per-range MD5, or a stored MD5 that is wrong:
                # fetch again. The same bytes twice mean it is what the service holds.
                if exc.digest is None or exc.digest in seen or len(seen) >= self.ctx.config.max_retries:
                    raise
                seen.add(exc.digest)
                self.ctx.requests.retrier.note(exc)
            except ConflictError:
                # The blob changed during the download (If-Match failed): start over with the new version.
                if changed:
                    raise
                changed = True
                fresh = await self.ctx.request(lambda: self.ctx.store.get_properties(row.blob))
                if fresh is None:
                    raise
                log.info("%s changed during the download; starting it again", row.blob)
                props = fresh

    def _skipped(self, row: FileRow, props: BlobProperties, reason: str) -> FileResult:
        self.ctx.journal.finish_file(row.id, "skipped", error=reason)
        return FileResult(row.rel, row.blob, props.size, FileStatus.SKIPPED, reason=reason)

    async def _fetch(self, row: FileRow, props: BlobProperties, target: Path, seen: frozenset[bytes] = frozenset()
                     ) -> FileResult:
        ctx = self.ctx
        cfg = ctx.config
        loop = asyncio.get_running_loop()
        size = props.size
        block_size = row.block_size or cfg.block_size
        # Ranges already on disk are reused only for the same version of the blob, in the same partial file.
        resume = (row.etag == props.etag and row.state in ("active", "failed") and row.block_size is not None
                  and os.path.exists(part_path(target)) and os.path.getsize(part_path(target)) == size)
        # A range written but not fsynced is on disk only if the machine has not restarted since.
        boot = current_boot_id()
        done = {b.idx for b in ctx.journal.blocks(row.id) if b.boot is None or b.boot == boot} if resume else set()
        if not resume:
            block_size = cfg.block_size
            ctx.journal.start_file(row.id, nonce=None, block_size=block_size,
                                   n_blocks=block_count(size, block_size), size=size,
                                   mtime_ns=destination_mtime_ns(props), inode=0, reset=True, etag=props.etag)
            ctx.journal.flush()
        part = await loop.run_in_executor(ctx.io_pool, lambda: PartFile(target, size, keep=resume))
        want_md5 = cfg.check_md5 is not CheckMd5.NO_CHECK
        digest: bytes | None = None
        try:
            if size <= cfg.single_put_limit and not done:
                sent, digest = await self._single(row, props, part, want_md5, seen)
            else:
                whole = hashlib.md5() if want_md5 else None
                sent = await self._ranges(row, props, part, whole, block_size, done)
                digest = whole.digest() if whole is not None else None
            if want_md5:
                self._check_md5(row.blob, props, digest)
            mtime = destination_mtime_ns(props) if cfg.preserve_last_modified_time else None
            await loop.run_in_executor(ctx.io_pool, part.finish, mtime)
        except IntegrityError:
            part.discard()  # nothing at the final path, and no corrupt partial file to resume from
            ctx.journal.start_file(row.id, nonce=None, block_size=None, n_blocks=None, size=size,
                                   mtime_ns=0, inode=0, reset=True)
            raise
        except ConflictError:
            part.discard()
            raise
        finally:
            part.close()
        ctx.journal.finish_file(row.id, "committed", md5_hex=digest.hex() if digest and want_md5 else None,
                                etag=props.etag)
        reused = size - sent
        note = f"resumed: {reused} bytes were already on disk" if reused else ""
        return FileResult(row.rel, row.blob, size, FileStatus.TRANSFERRED, bytes_sent=sent, reason=note)

    def _check_md5(self, blob: str, props: BlobProperties, got: bytes | None) -> None:
        mode = self.ctx.config.check_md5
        stored = props.content_md5
        if stored is None:
            if mode is CheckMd5.FAIL_IF_DIFFERENT_OR_MISSING:
                raise IntegrityError(f"{blob}: the blob has no Content-MD5 (--check-md5 FailIfDifferentOrMissing)")
            if mode is CheckMd5.LOG_ONLY:
                log.warning("%s: the blob has no Content-MD5 to check against", blob)
            return
        if stored != got:
            if mode is CheckMd5.LOG_ONLY:
                log.warning("%s: MD5 of the downloaded bytes differs from the blob's Content-MD5 "
                            "(--check-md5 LogOnly: kept)", blob)
                return
            raise ChecksumMismatchError(f"{blob}: MD5 of the downloaded bytes differs from the blob's Content-MD5 "
                                        "(the same bytes on every fetch); nothing was written at the final path",
                                        digest=got)

    async def _single(self, row: FileRow, props: BlobProperties, part: PartFile, want_md5: bool,
                      seen: frozenset[bytes]) -> tuple[int, bytes | None]:
        """One GET of the whole blob; returns the bytes sent and their MD5 (when checked or cheap to check)."""
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        if props.size == 0:  # no range to ask for; the GET still checks the blob is there, as this version
            await ctx.request(lambda: ctx.store.get_range(row.blob, 0, None, props.etag or None))
            ctx.progress.advanced(row.rel, 0, 0)
            return 0, hashlib.md5().digest()
        buf = await ctx.memory.buffer(props.size)
        view = memoryview(buf)
        try:
            digest = await ctx.request(lambda: self._get_checked(row.blob, 0, view, props.etag or None,
                                                                 need_md5=want_md5))
            if (not want_md5 and digest is not None and props.content_md5 is not None
                    and digest != props.content_md5 and digest not in seen):
                # Unchecked, but the bytes differ from the stored MD5 the service sent as the range's: damage
                # or a wrong stored MD5. Fetching again tells; the same bytes twice are kept.
                raise ChecksumMismatchError(f"{row.blob}: MD5 of the downloaded bytes differs from the blob's",
                                            digest=digest)
            await _in_thread(loop, ctx.io_pool, part.write_view, view, 0)
        finally:
            view.release()
            ctx.memory.release(buf)
        ctx.progress.advanced(row.rel, props.size, props.size)
        return props.size, digest

    async def _get_checked(self, blob: str, offset: int, view: memoryview, etag: str | None, *,
                           need_md5: bool = False) -> bytes | None:
        """One ranged GET into `view`, verified against the range MD5 the service sends for small ranges: a
        mismatch was damage in transit, raised as a transient error so that the request path fetches it again.
        Returns the MD5 of the bytes when it was computed (or `need_md5` asks for it)."""
        ctx = self.ctx
        check = len(view) <= RANGE_MD5_MAX
        got = await ctx.store.get_range_into(blob, offset, view, etag, range_md5=check)
        if got.range_md5 is None and not need_md5:
            return None
        digest = await _in_thread(asyncio.get_running_loop(), ctx.io_pool, _md5, view)
        whole_blob = offset == 0 and len(view) == got.size
        if got.range_md5 is not None and digest != got.range_md5 and not (whole_blob
                                                                          and got.range_md5 == got.content_md5):
            # (For a range that is the whole blob, Azurite answers with the stored Content-MD5: a mismatch with
            # that may be a wrong stored MD5, not damage; the whole-file check decides, after one refetch.)
            raise CorruptedInTransitError(f"get blob {blob!r}: bytes {offset}-{offset + len(view) - 1} arrived "
                                          "damaged (their MD5 differs from the service's)")
        return digest

    async def _ranges(self, row: FileRow, props: BlobProperties, part: PartFile, whole: hashlib._Hash | None,
                      block_size: int, done: set[int]) -> int:
        """Fetch the missing ranges in parallel, each straight into a pooled buffer; write each with pwrite and
        hash them in order as they become available (a range's buffer goes back to the pool once hashed)."""
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        ranges = list(block_ranges(props.size, block_size))
        # A fetched range waits here (its buffer) until hashed in order; None: it was on disk already.
        results: dict[int, asyncio.Future[BlockBuffer | None]] = {idx: loop.create_future() for idx, _, _ in ranges}
        window = Window(lambda: ctx.limiter.limit)
        tasks: set[asyncio.Task[None]] = set()
        sent = 0
        boot = current_boot_id()
        unsynced: list[int] = []  # ranges journaled as written in this boot, not yet fsynced
        syncing: list[asyncio.Task[None]] = []
        last_sync = loop.time()

        async def sync_part(indexes: list[int]) -> None:
            # Periodically, not per range: an fdatasync per 8 MiB would cost more than the write. Until then a
            # killed process loses nothing (the page cache holds the data); a power cut loses these ranges,
            # and the journal says so (their boot).
            await _in_thread(loop, ctx.io_pool, part.sync)
            ctx.journal.ranges_synced(row.id, indexes)

        async def fetch(idx: int, offset: int, length: int, buf: BlockBuffer) -> None:
            nonlocal sent, last_sync
            view = memoryview(buf)[:length]
            try:
                await ctx.request(lambda: self._get_checked(row.blob, offset, view, props.etag))
                await _in_thread(loop, ctx.io_pool, part.write_view, view, offset)
            except BaseException:
                ctx.memory.release(buf)
                window.release()
                # The failure itself surfaces through this task; the in-order hasher just stops.
                if idx in results:
                    results[idx].cancel()
                raise
            finally:
                view.release()
            ctx.journal.block_done(row.id, idx, length, "", durable=True, boot=boot)
            ctx.progress.advanced(row.rel, length, length)
            sent += length
            unsynced.append(idx)
            if loop.time() - last_sync >= _SYNC_INTERVAL and (not syncing or syncing[-1].done()):
                last_sync = loop.time()
                syncing.append(asyncio.create_task(sync_part(unsynced[:])))
                unsynced.clear()
            if whole is None:
                window.release()
                ctx.memory.release(buf)
                results[idx].set_result(None)
            else:
                # The window slot stays taken until the range is hashed: fetching may run at most a window ahead
                # of the in-order MD5, so the hash (the serial part) is never left with a long backlog to work
                # through alone once the last byte has arrived, and fewer buffers are needed.
                results[idx].set_result(buf)

        def hash_range(buf: BlockBuffer, length: int) -> asyncio.Future[None]:
            # Off the event loop: hashing 8 MiB takes ~10 ms, long enough to stall every other request.
            assert whole is not None
            view = memoryview(buf)[:length]
            hashed = asyncio.ensure_future(_in_thread(loop, ctx.hash_pool, whole.update, view))

            def done(_: object) -> None:  # also when cancelled before it started: the buffer is never lost
                view.release()
                ctx.memory.release(buf)
                window.release()

            hashed.add_done_callback(done)
            return hashed

        async def hash_in_order() -> None:
            # Each range is queued on the one hash thread as soon as it and all before it are here, without
            # waiting for the previous one to be hashed: the thread's queue keeps the order, and the thread never
            # waits for the event loop between two ranges (~0.6 ms a hop, 128 hops a GiB).
            assert whole is not None
            hashing: list[asyncio.Future[None]] = []
            try:
                for idx, offset, length in ranges:
                    buf = await results[idx]
                    del results[idx]  # from here on this buffer is the hasher's to release
                    if buf is None:  # on disk from an earlier run
                        hashing.append(asyncio.ensure_future(
                            _in_thread(loop, ctx.hash_pool, part.md5_of_range, whole, offset, length)))
                    else:
                        hashing.append(hash_range(buf, length))
                    while hashing and hashing[0].done():
                        hashing.pop(0).result()
                await gather_or_cancel(hashing)
            except BaseException:
                await cancel_all(hashing)
                raise

        hasher = asyncio.create_task(hash_in_order()) if whole is not None else None
        try:
            for idx, offset, length in ranges:
                if idx in done:
                    results[idx].set_result(None)
                    ctx.progress.advanced(row.rel, length, 0)
                    continue
                for task in [t for t in tasks if t.done()]:
                    tasks.discard(task)
                    task.result()
                await window.acquire()
                buf = await ctx.memory.buffer(block_size)
                tasks.add(asyncio.create_task(fetch(idx, offset, length, buf)))
            if tasks:
                done_tasks, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                for task in done_tasks:
                    task.result()
            if hasher is not None:
                await hasher
            await asyncio.gather(*syncing)
        except BaseException:
            for task in [*tasks, *([hasher] if hasher else [])]:
                task.cancel()
            await asyncio.gather(*tasks, *([hasher] if hasher else []), *syncing, return_exceptions=True)
            for future in results.values():  # fetched but never hashed: their buffers go back to the pool
                if future.done() and not future.cancelled() and future.exception() is None:
                    got = future.result()
                    if got is not None:
                        ctx.memory.release(got)
            raise
        return sent


def _md5(view: memoryview) -> bytes:
    return hashlib.md5(view).digest()


async def _in_thread(loop: asyncio.AbstractEventLoop, pool: Executor, fn: Callable[..., T],
                     *args: object) -> T:
    """Run `fn(*args)` in `pool`; if cancelled meanwhile (even repeatedly), still wait for the thread: it uses
    the caller's buffer, which the caller frees once this returns."""
    future = loop.run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # seen: the cancellation is what this call reports
        raise
