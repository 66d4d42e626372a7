"""The one chunk loop under every chunked write of bytes (a file, a stream, a split file's window of blocks): a window
slot and a buffer of the memory budget per block, the whole MD5 in order in its lane, blocks the store holds or a
delta keeps left unsent, the others staged side by side and journaled, each buffer released once both its part and
the MD5 are done with it; then the one commit."""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from blobsync.backends.base import BlobHeaders, BlockCheck, ChunkedWriter, Conditions, PartCheck, PutResult
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.commit import ForeignParts, commit_checked, part_layout
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import DeltaBase
from blobsync.engine.digest import BlockDigests, block_digests, crc64_metadata, new_md5, part_digests
from blobsync.engine.prior import PriorBlocks
from blobsync.engine.tasks import cancel_all, gather_or_cancel, in_thread, raise_first_failure
from blobsync.errors import BlobsyncError, IntegrityError, TransientError
from blobsync.journal import FileRow
from blobsync.local.files import FileIdentity

log = logging.getLogger("blobsync")
HASH_AHEAD = 4  # blocks filled and waiting for the whole MD5 (it is serial: more only fills memory)


@dataclass
class UploadPlan:
    """What one chunked write writes: the blob, the source as opened, the properties, the preconditions."""

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
    """One attempt at a chunked write, and what each block turned out to be (sent, kept or found). A file's parts
    are laid out by its size up front; an open-ended one's (a stream's) are added as they fill (`grow`)."""

    row: FileRow | None  # the journal's row (None: a stream, which no later run can resume)
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
    foreign: ForeignParts | None = None  # parts another writer left, cleared once for the write
    open_ended: bool = False  # parts added as they fill; the size is known at the end
    grown: int = 0  # an open-ended write's bytes so far
    prior: PriorBlocks | None = None  # an earlier blob whose equal blocks the service stages (incremental)
    prior_note: str = ""  # why there is none, where one was asked for

    def __post_init__(self) -> None:
        if self.open_ended:
            return
        self.tokens, self.expected = part_layout(self.writer, self.size, self.block_size)
        self.kept = [False] * len(self.tokens)
        self.digests = [b""] * len(self.tokens)
        self.crcs = [None] * len(self.tokens)

    @property
    def size(self) -> int:
        return self.grown if self.open_ended else self.plan.identity.size

    @property
    def rel(self) -> str:
        """The name progress reports the write's bytes under."""
        return self.row.rel if self.row is not None else self.plan.blob

    def grow(self, length: int) -> int:
        """An open-ended write's next part, of `length` bytes: its index."""
        idx = len(self.tokens)
        token = self.writer.token(idx)
        self.tokens.append(token)
        self.expected[token] = length
        self.kept.append(False)
        self.digests.append(b"")
        self.crcs.append(None)
        self.grown += length
        return idx

    def lengths(self) -> list[int]:
        """Each committed part's length, in order."""
        return [self.expected[token] for token in self.tokens]


class ChunkLoop:
    """One chunked write's blocks in flight. For each block the caller takes a `slot` (waiting while the write has
    its window of blocks out, or HASH_AHEAD blocks wait for the MD5), fills it, and `put`s it; `finish` waits for
    every part and returns the whole MD5 (None without a hash `lane`). A block `put` without its digests has them
    computed beside its request (a stream's caller goes on producing meanwhile) with `check`."""

    def __init__(self, ctx: EngineContext, w: BlockWrite, lane: ThreadPoolExecutor | None,
                 check: BlockCheck | None = None) -> None:
        self.ctx, self.w, self.lane, self.check = ctx, w, lane, check
        self.whole = new_md5() if lane is not None else None
        self._hashed: asyncio.Future[None] | None = None  # the last block queued on the hash lane
        self._queued: collections.deque[asyncio.Future[None]] = collections.deque()
        self._sends: set[asyncio.Task[None]] = set()
        # Filling further ahead than the requests that can be in flight only fills memory (and costs page faults):
        # a write keeps at most concurrency + 2 blocks filled and not yet sent.
        self._window = Window(lambda: ctx.limiter.limit)

    async def slot(self, length: int) -> tuple[BlockBuffer, memoryview]:
        """A pooled buffer for the next block (`length` bytes of it in the view), once the write may have one more
        block out; a part that failed meanwhile is raised here (it stops the write now, not after the rest)."""
        await self.lend()
        try:
            buf = await self.ctx.memory.buffer(self.w.block_size)
        except BaseException:
            self._window.release()
            raise
        return buf, memoryview(buf)[:length]

    async def lend(self) -> None:
        """Wait until the write may have one more block out, for a block sent from the caller's own memory (`put`
        with no buffer: the caller keeps it unchanged until `finish`)."""
        raise_first_failure(self._sends)
        while len(self._queued) >= HASH_AHEAD:
            await self._queued.popleft()
        await self._window.acquire()

    def drop(self, buf: BlockBuffer) -> None:
        """A slot given back unfilled (its read failed, or the write ended another way)."""
        self.ctx.memory.release(buf)
        self._window.release()

    def put(self, idx: int, buf: BlockBuffer | None, view: memoryview, got: BlockDigests | None) -> None:
        """Block `idx`, filled in `view`: hashed in order, then staged unless the store holds it already or the
        delta keeps it. `got`: its digests as read (None: computed beside its request)."""
        hashed = None
        if self.whole is not None:
            hashed = self._hashed = asyncio.get_running_loop().run_in_executor(self.lane, self.whole.update, view)
            self._queued.append(hashed)
        check: PartCheck | None = None
        if got is not None:
            check, self.w.crcs[idx], self.w.digests[idx] = got
            if self._found(idx, len(view)):
                self._release_after(buf, hashed)
                self._window.release()
                return
        self._sends.add(asyncio.create_task(self._send(idx, view, got is None, check, buf, hashed)))

    async def _copied(self, idx: int, length: int) -> bool:
        """Whether block `idx` was staged by the service from the earlier blob holding the same bytes at the same
        place (checked by the service against this block's CRC64); else it is sent."""
        w = self.w
        prior, crc = w.prior, w.crcs[idx]
        offset = prior.offset(idx, length, w.digests[idx]) if prior is not None and crc is not None else None
        if prior is None or crc is None or offset is None:
            return False
        check = PartCheck(BlockCheck.CRC64, struct.pack("<Q", crc))
        try:
            await self.ctx.request(lambda: w.writer.stage_from(idx, prior.source, offset, length, check))
        except BlobsyncError as exc:
            if getattr(exc, "status", None) in (404, 412) or isinstance(exc, TransientError):
                # The earlier blob went or changed, or the service failed a copy through every retry: no use
                # asking for its other blocks.
                prior.broken = True
            log.info("%s: block %d sent: the service did not stage it from %r (%s)", w.plan.blob, idx, prior.name,
                     exc.message)
            return False
        prior.copied += length
        w.reused += length
        return True

    def _found(self, idx: int, length: int) -> bool:
        """Whether block `idx` needs no sending: unchanged since the committed version (delta), or held already."""
        w = self.w
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
        self.ctx.progress.advanced(w.rel, length, 0)
        return True

    async def _send(self, idx: int, view: memoryview, digest: bool, check: PartCheck | None,
                    buf: BlockBuffer | None, hashed: asyncio.Future[None] | None) -> None:
        ctx, w = self.ctx, self.w
        try:
            if digest and (w.prior is not None or ctx.config.block_digests):  # an incremental write's blocks
                check, w.crcs[idx], w.digests[idx] = await in_thread(ctx.io_pool, block_digests, view, None,
                                                                     self.check)
            elif digest:  # in a thread: an MD5 of a block (the emulator's check) would stall the loop ~10 ms
                check, w.crcs[idx] = await in_thread(ctx.io_pool, part_digests, view, self.check)
            copied = await self._copied(idx, len(view))
            if not copied:
                def send() -> Awaitable[None]:
                    return ctx.request(lambda: w.writer.stage(idx, view, check))

                await (w.foreign.stage(send) if w.foreign is not None else send())
        finally:
            self._release_after(buf, hashed)
            self._window.release()
        if w.row is not None:
            ctx.journal.block_done(w.row.id, idx, len(view), check.value.hex() if check is not None else "")
        ctx.progress.advanced(w.rel, len(view), 0 if copied else len(view))

    def _release_after(self, buf: BlockBuffer | None, hashed: asyncio.Future[None] | None) -> None:
        if buf is None:  # the caller's memory: nothing of the budget's to give back
            return
        if hashed is None or hashed.done():
            self.ctx.memory.release(buf)
        else:
            hashed.add_done_callback(lambda _: self.ctx.memory.release(buf))

    async def finish(self) -> bytes | None:
        """Wait for every part (the first failure cancels the rest) and the MD5; the whole MD5."""
        if self._sends:
            await gather_or_cancel(self._sends)
        if self._hashed is not None:
            await self._hashed
        return self.whole.digest() if self.whole is not None else None

    async def cancel(self) -> None:
        """Stop the parts in flight (their buffers go back once their thread and the MD5 are done with them)."""
        await cancel_all(self._sends)


def prior_notes(w: BlockWrite) -> list[str]:
    """What an incremental write says when it was sent whole: no earlier blob to compare with, or none of its
    blocks equal (another layout)."""
    if w.prior_note:
        return [w.prior_note]
    if w.prior is not None and not w.prior.copied and len(w.tokens) > 1:
        return [f"incremental: sent whole: no block equals {w.prior.name!r}'s (another layout)"]
    return []


async def commit_write(ctx: EngineContext, w: BlockWrite, md5: bytes | None) -> PutResult:
    """The write's one commit, with the whole MD5 as its Content-MD5 and the whole blob's CRC64 composed from the
    blocks' (what a download checks in parallel; no second pass), verified after."""
    # A delta names committed parts of one exact version: commit only over that version.
    conditions = Conditions(if_match=w.base.etag) if w.base is not None else \
        w.foreign.conditions if w.foreign is not None else w.plan.conditions
    crc = crc64_metadata(list(zip(w.crcs, w.lengths(), strict=True)), md5)
    headers = replace(w.plan.headers, content_md5=md5, metadata={**w.plan.headers.metadata, **crc})
    return await commit_checked(ctx, w.writer, w.plan.blob, list(zip(w.tokens, w.kept, strict=True)), w.expected,
                                headers, conditions)
