"""Downloads one blob: a single GET when small, else parallel ranged GETs (If-Match) into a partial file."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from blobsync.backends.base import BlobProperties
from blobsync.checksums import crc64_int
from blobsync.config import Overwrite
from blobsync.engine.blocks import block_count, block_ranges
from blobsync.engine.budget import BlockBuffer, new_buffer
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import (
    EMPTY_MD5,
    WRITTEN_NOWHERE,
    Digest,
    WholeKind,
    crc64_digest,
    feed,
    new_md5,
    verify_read,
    whole_check,
)
from blobsync.engine.fetching import FileSink, RangeFetch, read_checked, read_whole
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.tasks import in_thread
from blobsync.errors import ChecksumMismatchError, ConflictError, IntegrityError
from blobsync.journal import RESUMABLE, FileRow
from blobsync.local.target import PartFile, current_boot_id, found_placed, part_path
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")


def shared_part(target: Path, size: int, root: Path, *, keep: bool) -> PartFile:
    """The partial file of a download several workers write ranges of (a split file): sized, locked shared, no
    link followed below `root`. `keep=False` starts it afresh (the client, before the range tasks)."""
    return PartFile(target, size, keep=keep, root=root, shared=keep)


class FileDownloader:
    """Downloads blobs of one job. Errors that concern only the file are raised as such; callers decide."""

    def __init__(self, ctx: EngineContext, root: Path | None = None) -> None:
        self.ctx = ctx
        self.root = root  # the target folder: no link below it is followed (default: each target's folder)

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

        async def new_version() -> bool:
            nonlocal props
            fresh = await self.ctx.request(lambda: self.ctx.store.stat(row.blob))
            props = fresh or props
            return fresh is not None

        return await read_whole(self.ctx, row.blob, lambda seen: self._fetch(row, props, target, seen), new_version)

    def _skipped(self, row: FileRow, props: BlobProperties, reason: str) -> FileResult:
        return FileResult(row.rel, row.blob, props.size, FileStatus.SKIPPED, reason=reason)

    async def _fetch(self, row: FileRow, props: BlobProperties, target: Path, seen: frozenset[bytes] = frozenset()
                     ) -> FileResult:
        ctx = self.ctx
        cfg = ctx.config
        # What the bytes are checked by (digest.whole_check): the CRC64 blobsync stored, composed as ranges land,
        # else the MD5 where there is a Content-MD5 (with none, it would check nothing), else nothing.
        kind = whole_check(cfg.check_md5, row.blob, props)
        if self._placed_before(row, props, target):
            return FileResult(row.rel, row.blob, props.size, FileStatus.TRANSFERRED,
                              reason="finished by an earlier run (found at its final name)", etag=props.etag or None,
                              content_md5=props.content_md5, url=blob_url(ctx.store.container_url, row.blob))
        block_size, done = self._resumable(row, props, target)
        part = await in_thread(ctx.io_pool, lambda: PartFile(target, props.size, keep=done is not None,
                                                             root=self.root))
        done = done or set()
        try:
            sent, got = await self._fetch_into(row, props, part, block_size, done, kind, seen)
            got = await self._verify(row, props, part, got)
            mtime = destination_mtime_ns(props) if cfg.preserve_last_modified_time else None
            if props.size > cfg.single_put_limit:  # worth a journal write: a kill after the rename costs no refetch
                ctx.journal.placing(row.id, await in_thread(ctx.io_pool, part.seal, mtime))
                await in_thread(ctx.io_pool, part.place)
            else:
                await in_thread(ctx.io_pool, part.finish, mtime)
        except IntegrityError:
            part.discard()  # nothing at the final path, and no corrupt partial file to resume from
            ctx.journal.start_file(row.id, nonce=None, block_size=None, n_blocks=None, size=props.size,
                                   mtime_ns=0, inode=0, reset=True)
            raise
        except ConflictError:
            part.discard()
            raise
        finally:
            part.close()
        reused = props.size - sent
        note = f"resumed: {reused} bytes were already on disk" if reused else ""
        return FileResult(row.rel, row.blob, props.size, FileStatus.TRANSFERRED, bytes_sent=sent, reason=note,
                          etag=props.etag or None,
                          content_md5=got.value if got is not None and got.kind == "md5" else props.content_md5,
                          url=blob_url(ctx.store.container_url, row.blob))

    async def _verify(self, row: FileRow, props: BlobProperties, part: PartFile, got: Digest | None
                      ) -> Digest | None:
        """--check-md5 on the digest of the bytes fetched (a stale CRC64 settled by the MD5 of the file)."""

        async def md5_again() -> bytes:
            whole = new_md5()
            await in_thread(self.ctx.io_pool, feed, whole, part.chunks(0, props.size))
            return whole.digest()

        return await verify_read(self.ctx.config.check_md5, row.blob, props, got, md5_again, WRITTEN_NOWHERE)

    @staticmethod
    def _placed_before(row: FileRow, props: BlobProperties, target: Path) -> bool:
        """An earlier run of this job fetched and checked this version whole and renamed it into place, and was
        stopped before it recorded that (Journal.placing): the file at the target is that one, untouched."""
        return (row.state in RESUMABLE and bool(props.etag) and row.etag == props.etag and row.nonce is not None
                and row.nonce.startswith("placed ") and found_placed(target, row.nonce))

    def _resumable(self, row: FileRow, props: BlobProperties, target: Path) -> tuple[int, set[int] | None]:
        """The block size and the ranges already on disk (None: start afresh, journaled and flushed first)."""
        ctx = self.ctx
        # Ranges already on disk are reused only for the same version of the blob, in the same partial file.
        if (row.etag == props.etag and row.state in RESUMABLE and row.block_size is not None
                and os.path.exists(part_path(target)) and os.path.getsize(part_path(target)) == props.size):
            # A range written but not fsynced is on disk only if the machine has not restarted since.
            boot = current_boot_id()
            return row.block_size, {b.idx for b in ctx.journal.blocks(row.id) if b.boot is None or b.boot == boot}
        block_size = ctx.config.block_size
        ctx.journal.start_file(row.id, nonce=None, block_size=block_size, n_blocks=block_count(props.size, block_size),
                               size=props.size, mtime_ns=destination_mtime_ns(props), inode=0, reset=True,
                               etag=props.etag)
        ctx.journal.flush()
        return block_size, None

    async def _fetch_into(self, row: FileRow, props: BlobProperties, part: PartFile, block_size: int, done: set[int],
                          kind: WholeKind, seen: frozenset[bytes]) -> tuple[int, Digest | None]:
        """The bytes fetched and the digest `kind` names of them: one GET when small, else ranges."""
        if props.size <= self.ctx.config.single_put_limit and not done:
            return await self._single(row, props, part, kind, seen)
        whole = new_md5() if kind == "md5" else None
        ctx, etag = self.ctx, props.etag or None
        fetch = RangeFetch(ctx, row.rel, row.blob, etag, block_ranges(props.size, block_size),
                           FileSink(ctx, part, row.id), whole, crc64=kind == "crc64")
        sent = await fetch.run(done)
        if kind == "crc64":
            return sent, await fetch.crc64()
        return sent, Digest("md5", whole.digest()) if whole is not None else None

    async def _single(self, row: FileRow, props: BlobProperties, part: PartFile, kind: WholeKind,
                      seen: frozenset[bytes]) -> tuple[int, Digest | None]:
        """One GET of the whole blob; returns the bytes sent and their digest (when checked or cheap to check)."""
        ctx = self.ctx
        if props.size == 0:  # no range to ask for; the GET still checks the blob is there, as this version
            await ctx.request(lambda: read_checked(ctx.store, None, row.blob, 0, memoryview(bytearray()),
                                                  props.etag or None))
            ctx.progress.advanced(row.rel, 0, 0)
            return 0, crc64_digest([]) if kind == "crc64" else Digest("md5", EMPTY_MD5)
        buf = await ctx.memory.buffer(props.size)
        view = memoryview(buf)
        try:
            digest = await ctx.request(lambda: read_checked(ctx.store, ctx.io_pool, row.blob, 0, view,
                                                            props.etag or None, need_md5=kind == "md5"))
            if (kind is None and digest is not None and props.content_md5 is not None
                    and digest != props.content_md5 and digest not in seen):
                # Unchecked, but the bytes differ from the stored MD5 the service sent as the range's: damage
                # or a wrong stored MD5. Fetching again tells; the same bytes twice are kept.
                raise ChecksumMismatchError(f"{row.blob}: MD5 of the downloaded bytes differs from the blob's",
                                            digest=digest)
            got = Digest("md5", digest) if kind == "md5" and digest is not None else None
            if kind == "crc64":
                got = crc64_digest([(await in_thread(ctx.io_pool, crc64_int, view), props.size)])
            await in_thread(ctx.io_pool, part.write_view, view, 0)
        finally:
            view.release()
            ctx.memory.release(buf)
        ctx.progress.advanced(row.rel, props.size, props.size)
        return props.size, got


class LandedHash:
    """The whole MD5 of a split download's shared partial file, taken in order on one hash lane as its blocks land
    (written by range tasks on other processes, in any order): the one check that cannot be split runs beside the
    fetches, not after them. Each block is read back (past the page cache, as the ranges were written) while the
    one before is hashed. `landed(idx)` as each block is reported written; `digest` resolves to the MD5's hex once
    every block is in (a read error fails it); `close()` stops it and gives the lane back."""

    def __init__(self, ctx: EngineContext, target: Path, size: int, block_size: int, root: Path,
                 done: set[int]) -> None:
        self.ctx, self.target, self.size, self.block_size, self.root = ctx, target, size, block_size, root
        self.landed_blocks = set(done)
        self.md5 = new_md5()
        self._wake = asyncio.Event()
        self._lane = ctx.hashing.take()
        self._hashing: asyncio.Future[None] | None = None  # the last block's update, in the lane
        self._part: PartFile | None = None
        self._bufs: list[BlockBuffer] = []
        self.digest: asyncio.Future[str] = asyncio.ensure_future(self._hash_all())

    def landed(self, idx: int) -> None:
        self.landed_blocks.add(idx)
        self._wake.set()

    async def _hash_all(self) -> str:
        ctx = self.ctx
        self._part = await in_thread(ctx.io_pool, lambda: shared_part(self.target, self.size, self.root, keep=True))
        self._bufs = [new_buffer(self.block_size) for _ in range(2)]  # page-aligned: read back past the cache
        for idx, offset, length in block_ranges(self.size, self.block_size):
            while idx not in self.landed_blocks:
                self._wake.clear()
                await self._wake.wait()
            view = memoryview(self._bufs[idx % 2])[:length]  # its last user (block idx - 2) is hashed already
            await in_thread(ctx.io_pool, self._part.read_back, view, offset)  # beside the previous block's update
            if self._hashing is not None:
                await self._hashing
            self._hashing = asyncio.get_running_loop().run_in_executor(ctx.hashing.pool(self._lane),
                                                                      self.md5.update, view)
        if self._hashing is not None:
            await self._hashing
        return self.md5.hexdigest()

    async def close(self) -> None:
        if not self.digest.done():
            self.digest.cancel()
        await asyncio.gather(self.digest, return_exceptions=True)
        if self._hashing is not None:  # a thread may still hash a buffer: it goes only after
            await asyncio.gather(self._hashing, return_exceptions=True)
        self.ctx.hashing.give_back(self._lane)
        if self._part is not None:
            await in_thread(self.ctx.io_pool, self._part.close)
            self._part = None
        for buf in self._bufs:
            if not isinstance(buf, bytearray):
                buf.close()  # an mmap: unmapped now, not when collected
        self._bufs = []
