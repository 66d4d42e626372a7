"""A file's chunked upload, step by step: what the store holds already, read and hash, stage, commit, verify."""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from blobsync.backends.base import BlobHeaders, BlockCheck, ChunkedWriter, Conditions, PartCheck, PutResult
from blobsync.checksums import choose_check, require_crc64
from blobsync.engine.blocks import block_ranges
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.commit import ForeignParts, commit_checked, part_layout
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import DeltaBase, committed_record
from blobsync.engine.digest import BlockDigests, block_digests, crc64_metadata, new_md5
from blobsync.engine.tasks import cancel_all, gather_or_cancel, in_thread, raise_first_failure
from blobsync.errors import IntegrityError, SourceChangedError
from blobsync.journal import FileRow
from blobsync.local.files import FileIdentity, Source
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")
HASH_AHEAD = 4  # blocks read and waiting for the whole-file MD5


@dataclass
class UploadPlan:
    """What one file's upload writes: the blob, the source as opened, the properties, the preconditions."""

    blob: str
    identity: FileIdentity
    headers: BlobHeaders
    conditions: Conditions
    expected_md5: bytes | None = None  # what the bytes read must hash to (a copy's source's Content-MD5)


def check_expected(plan: UploadPlan, md5: bytes | None) -> None:
    """Before the commit: the bytes read are the ones the source says it holds."""
    if plan.expected_md5 is not None and md5 is not None and md5 != plan.expected_md5:
        raise IntegrityError(f"{plan.blob}: the MD5 of the bytes read differs from the source's Content-MD5; "
                             "nothing committed")


@dataclass
class BlockWrite:
    """One attempt at a file's chunked write, and what each block turned out to be (sent, kept or found)."""

    row: FileRow
    plan: UploadPlan
    nonce: str  # the write's part identities follow from it (journaled before the first part leaves)
    writer: ChunkedWriter
    block_size: int
    base: DeltaBase | None  # the committed version a delta builds on
    tokens: list[str] = field(default_factory=list)  # the part committed at each index
    kept: list[bool] = field(default_factory=list)  # whether that part is one of the current version's
    expected: dict[str, int] = field(default_factory=dict)  # token -> length the commit must show
    digests: list[bytes] = field(default_factory=list)  # xxh3-128 per block: the next delta compares these
    crcs: list[int | None] = field(default_factory=list)  # CRC64 per block: the whole blob's is composed of them
    present: dict[str, bool] = field(default_factory=dict)  # parts the store holds: token -> committed
    reused: int = 0  # bytes not sent: found staged, committed, or unchanged (delta)
    delta: int = 0  # bytes of unchanged blocks a delta kept
    first: int = 0  # the window of blocks this attempt reads and stages: [first, last) (a split file's range)
    last: int | None = None  # None: to the end
    foreign: ForeignParts | None = None  # parts another writer left, cleared once for the write (see run)

    def __post_init__(self) -> None:
        self.tokens, self.expected = part_layout(self.writer, self.size, self.block_size)
        self.kept = [False] * len(self.tokens)
        self.digests = [b""] * len(self.tokens)
        self.crcs = [None] * len(self.tokens)

    @property
    def size(self) -> int:
        return self.plan.identity.size


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
        # A delta names committed parts of one exact version: commit only over that version.
        conditions = Conditions(if_match=w.base.etag) if w.base is not None else w.foreign.conditions
        headers = w.plan.headers
        # The whole blob's CRC64, composed from the blocks' (no second pass): what a download checks in parallel.
        crc = crc64_metadata(list(zip(w.crcs, (length for _, _, length in block_ranges(w.size, w.block_size)),
                                      strict=True)), md5)
        headers = replace(headers, content_md5=md5, metadata={**headers.metadata, **crc})
        result = await commit_checked(self.ctx, w.writer, w.plan.blob, list(zip(w.tokens, w.kept, strict=True)),
                                      w.expected, headers, conditions)
        return self._record(w, result, md5)

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
        ctx = self.ctx
        whole = new_md5() if lane is not None else None
        hashed: asyncio.Future[None] | None = None  # the last block queued on the one hash thread
        queued: collections.deque[asyncio.Future[None]] = collections.deque()
        sends: set[asyncio.Task[None]] = set()
        # Reading further ahead than the requests that can be in flight only fills memory (and costs page
        # faults): a file keeps at most concurrency + 2 blocks read and not yet sent.
        window = Window(lambda: ctx.limiter.limit)
        try:
            for idx, offset, length in itertools.islice(block_ranges(w.size, w.block_size), w.first, w.last):
                raise_first_failure(sends)
                while len(queued) >= HASH_AHEAD:  # the whole-file MD5 is serial: more queued only fills memory
                    await queued.popleft()
                buf, view, check = await self._read_block(w, src, window, idx, offset, length)
                if whole is not None:
                    hashed = asyncio.get_running_loop().run_in_executor(lane, whole.update, view)
                    queued.append(hashed)
                if self._found(w, idx, length):
                    self._release_after(buf, hashed)
                    window.release()
                else:
                    sends.add(asyncio.create_task(self._send(w, idx, view, check, buf, hashed, window)))
            if sends:
                await gather_or_cancel(sends)
            if hashed is not None:
                await hashed
            if src.identity() != w.plan.identity:
                raise SourceChangedError(f"{src.path}: file changed while it was being uploaded; nothing committed")
        except BaseException:
            await cancel_all(sends)
            raise
        return whole.digest() if whole is not None else None

    async def _read_block(self, w: BlockWrite, src: Source, window: Window, idx: int, offset: int, length: int
                          ) -> tuple[BlockBuffer, memoryview, PartCheck | None]:
        """A window slot and a pooled buffer, filled from the file in a worker thread with its digests."""
        ctx = self.ctx
        await window.acquire()
        try:
            buf = await ctx.memory.buffer(w.block_size)
        except BaseException:
            window.release()
            raise
        view = memoryview(buf)[:length]
        old = w.base.block_at(idx, length) if w.base is not None else None
        try:
            # A block the store holds already (resume) is only read for the whole-file MD5 and the delta memory:
            # its own check would cost CPU for nothing.
            got = await in_thread(ctx.io_pool, read_block, src, view, offset, old[1] if old is not None else None,
                                  self.check if w.tokens[idx] not in w.present else None)
            check, w.crcs[idx], w.digests[idx] = got
        except BaseException:
            ctx.memory.release(buf)
            window.release()
            raise
        return buf, view, check

    def _found(self, w: BlockWrite, idx: int, length: int) -> bool:
        """Whether block `idx` needs no sending: unchanged since the committed version (delta), or held already."""
        old = w.base.block_at(idx, length) if w.base is not None else None
        if old is not None and w.digests[idx] == old[1]:
            w.tokens[idx] = old[0]  # name the committed part: nothing is sent
            w.expected[old[0]] = length
            w.kept[idx] = True
            w.delta += length
        elif w.tokens[idx] in w.present:
            w.kept[idx] = w.present[w.tokens[idx]]
        else:
            return False
        w.reused += length
        self.ctx.progress.advanced(w.row.rel, length, 0)
        return True

    async def _send(self, w: BlockWrite, idx: int, view: memoryview, check: PartCheck | None, buf: BlockBuffer,
                    hashing: asyncio.Future[None] | None, window: Window) -> None:
        ctx = self.ctx
        try:
            def send() -> Awaitable[None]:
                return ctx.request(lambda: w.writer.stage(idx, view, check))

            await (w.foreign.stage(send) if w.foreign is not None else send())
        finally:
            self._release_after(buf, hashing)
            window.release()
        ctx.journal.block_done(w.row.id, idx, len(view), check.value.hex() if check is not None else "")
        ctx.progress.advanced(w.row.rel, len(view), len(view))

    def _release_after(self, buf: BlockBuffer, hashing: asyncio.Future[None] | None) -> None:
        if hashing is None or hashing.done():
            self.ctx.memory.release(buf)
        else:
            hashing.add_done_callback(lambda _: self.ctx.memory.release(buf))

    def _record(self, w: BlockWrite, result: PutResult, md5: bytes | None) -> FileResult:
        ctx, blob = self.ctx, w.plan.blob
        lengths = [length for _, _, length in block_ranges(w.size, w.block_size)]
        ctx.journal.remember_commit(ctx.store.container_url, blob, committed_record(
            w.block_size, result.etag, w.size, md5, list(zip(w.tokens, lengths, w.digests, strict=True))))
        notes = []
        if w.delta:
            notes.append(f"delta: {w.delta} bytes of unchanged blocks reused")
        if w.reused - w.delta:
            notes.append(f"resumed: {w.reused - w.delta} bytes were already on the service")
        return FileResult(w.row.rel, blob, w.size, FileStatus.TRANSFERRED, bytes_sent=w.size - w.reused,
                          reason="; ".join(notes), bytes_delta=w.delta, etag=result.etag, content_md5=md5,
                          url=blob_url(ctx.store.container_url, blob), version_id=result.version_id)

