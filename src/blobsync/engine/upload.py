"""Uploads one local file: a single Put Blob when small, else resumable Put Block + Put Block List + verify."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import mimetypes
from dataclasses import dataclass, replace
from pathlib import Path

from blobsync.backends.base import BlobHeaders, BlockList, BlockState, Conditions, PutResult
from blobsync.config import PROPERTY_HEADERS, Overwrite
from blobsync.engine.budget import BlockBuffer, Window
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import DeltaBase, committed_record, find_base
from blobsync.engine.mtime import MTIME_KEY, destination_mtime_ns, format_mtime
from blobsync.engine.plan import (
    BLOCK_ID_LENGTH,
    block_count,
    block_id,
    block_ranges,
    choose_block_size,
    new_nonce,
)
from blobsync.engine.tasks import cancel_all, gather_or_cancel
from blobsync.errors import ConflictError, IntegrityError, InvalidBlockListError, ServiceError, SourceChangedError
from blobsync.journal import FileRow
from blobsync.local.files import INLINE_READ_MAX, FileIdentity, OpenFile
from blobsync.location import check_blob_name
from blobsync.report import FileResult, FileStatus

log = logging.getLogger("blobsync")



@dataclass
class _Plan:
    blob: str
    identity: FileIdentity
    headers: BlobHeaders
    conditions: Conditions


class FileUploader:
    """Uploads files of one job. Errors that concern only the file are raised as such; callers decide."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx

    async def upload(self, row: FileRow, path: Path) -> FileResult:
        check_blob_name(row.blob)
        src = OpenFile(path)
        try:
            return await self._upload(row, src)
        finally:
            src.close()  # every read of it has finished by now, even on cancellation

    async def _upload(self, row: FileRow, src: OpenFile) -> FileResult:
        cfg = self.ctx.config
        path = src.path
        identity = src.opened
        conditions = Conditions()
        if cfg.overwrite is not Overwrite.TRUE:
            props = await self.ctx.request(lambda: self.ctx.store.get_properties(row.blob))
            if props is not None:
                if cfg.overwrite is Overwrite.FALSE:
                    return self._skipped(row, identity, "exists at the destination (--overwrite false)")
                if cfg.overwrite is Overwrite.IF_SOURCE_NEWER and identity.mtime_ns <= destination_mtime_ns(props):
                    return self._skipped(row, identity, "destination is as new or newer (--overwrite ifSourceNewer)")
                prompt = self.ctx.overwrite_prompt
                if cfg.overwrite is Overwrite.PROMPT and prompt is not None and not await prompt(
                        f"blob {row.blob!r} exists ({props.size} bytes)"):
                    return self._skipped(row, identity, "exists at the destination (not overwritten, as answered)")
                conditions = Conditions(if_match=props.etag)
            else:
                conditions = Conditions(if_none_match_any=True)
        content_type = cfg.content_type or (_guess_type(path) if cfg.guess_mime_type else OCTET_STREAM)
        metadata = {**cfg.metadata, MTIME_KEY: format_mtime(identity.mtime_ns)}
        properties = {PROPERTY_HEADERS[k]: v for k, v in cfg.properties.items()}
        headers = BlobHeaders(content_type, None, metadata, cfg.tier, properties, cfg.blob_tags)
        plan = _Plan(row.blob, identity, headers, conditions)
        if identity.size <= cfg.single_put_limit:
            return await self._put_single(row, src, plan)
        return await self._put_blocks(row, src, plan)

    def _skipped(self, row: FileRow, identity: FileIdentity, reason: str) -> FileResult:
        self.ctx.journal.finish_file(row.id, "skipped", error=reason)
        return FileResult(row.rel, row.blob, identity.size, FileStatus.SKIPPED, reason=reason)

    # --- small files --------------------------------------------------------------------------------------

    async def _put_single(self, row: FileRow, src: OpenFile, plan: _Plan) -> FileResult:
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        before = plan.identity
        reserved = await ctx.memory.reserve(before.size)
        try:
            # A small file already in the page cache is read and hashed on the loop: cheaper than the hand-off to
            # a worker thread and back. One that would wait for the disk goes to a thread like the big ones.
            cached = src.read_all_cached(before.size) if before.size <= INLINE_READ_MAX else None
            data: bytes | bytearray
            if cached is not None:
                data, md5 = cached
            else:
                reading = loop.run_in_executor(ctx.io_pool, src.read_all, before.size)
                try:
                    data, md5 = await reading
                except asyncio.CancelledError:
                    await asyncio.wait([reading])  # the thread still reads from the file
                    raise
            if src.identity() != before:
                raise SourceChangedError(f"{src.path}: file changed while it was being read")
            headers = replace(plan.headers, content_md5=md5)
            result = await ctx.request(lambda: ctx.store.put_blob(plan.blob, data, headers, plan.conditions))
        finally:
            ctx.memory.unreserve(reserved)
        if result.content_md5 is not None and result.content_md5 != md5:
            raise IntegrityError(f"{plan.blob}: the service stored a different MD5 than was sent")
        ctx.progress.advanced(row.rel, before.size, before.size)
        ctx.journal.start_file(row.id, nonce=None, block_size=None, n_blocks=None, size=before.size,
                               mtime_ns=before.mtime_ns, inode=before.inode, reset=True)
        ctx.journal.finish_file(row.id, "committed", md5_hex=md5.hex(), etag=result.etag, bytes_sent=before.size)
        ctx.journal.forget_commit(ctx.store.container_url, plan.blob)
        return FileResult(row.rel, plan.blob, before.size, FileStatus.TRANSFERRED, bytes_sent=before.size)

    # --- block uploads ------------------------------------------------------------------------------------

    async def _put_blocks(self, row: FileRow, src: OpenFile, plan: _Plan) -> FileResult:
        nonce = row.nonce
        block_size = row.block_size
        size = plan.identity.size
        ident = plan.identity
        same_source = (row.size, row.mtime_ns, row.inode, row.ctime_ns) == (size, ident.mtime_ns, ident.inode,
                                                                            ident.ctime_ns)
        # Resume only the same source with the same nonce; anything else starts clean with a new nonce.
        resume = bool(nonce and block_size and same_source and row.state in ("active", "failed", "committed"))
        base = await find_base(self.ctx, plan.blob, size)
        if base is not None and resume and block_size != base.block_size:
            base = None  # an interrupted transfer of this very source goes on as it began
        attempt = 0
        while True:
            if not resume or nonce is None or block_size is None:
                nonce = base.fresh_nonce() if base is not None else new_nonce()
                # A delta keeps the committed block size: auto-sizing must not shift every block boundary.
                block_size = (base.block_size if base is not None
                              else choose_block_size(size, self.ctx.config.block_size))
                self.ctx.journal.start_file(
                    row.id, nonce=nonce, block_size=block_size, n_blocks=block_count(size, block_size),
                    size=size, mtime_ns=plan.identity.mtime_ns, inode=plan.identity.inode, reset=True,
                    ctime_ns=plan.identity.ctime_ns,
                )
                # The nonce must be durable before the first block leaves, or a crash orphans the blocks.
                self.ctx.journal.flush()
            try:
                return await self._send_file(row, src, plan, nonce, block_size, resume, base)
            except (ConflictError, InvalidBlockListError) as exc:
                if base is not None:
                    # The version the delta built on changed under us (412) or lacks a block it named: send
                    # the whole file under this nonce, keeping the changed blocks already staged.
                    log.info("%s: delta commit refused (%s): full upload", plan.blob, exc.code)
                    base = None
                    resume = True
                    continue
                # Staged blocks vanished before the commit (expired, discarded, service restarted):
                # ask the service what it still has and send the rest again.
                if isinstance(exc, ConflictError) or attempt == 2:
                    raise
                resume = True
            except ServiceError as exc:
                if exc.code != "InvalidBlobOrBlock" or attempt == 2:
                    raise
                # Usually leftover uncommitted blocks with IDs of another length (another tool's upload).
                if not await self._clear_foreign_blocks(plan):
                    raise
                resume = False
            attempt += 1

    async def _send_file(
        self, row: FileRow, src: OpenFile, plan: _Plan, nonce: str, block_size: int, resume: bool,
        base: DeltaBase | None,
    ) -> FileResult:
        ctx = self.ctx
        store = ctx.store
        loop = asyncio.get_running_loop()
        size = plan.identity.size
        n = block_count(size, block_size)
        ids = [block_id(nonce, i) for i in range(n)]
        expected = {ids[i]: length for i, _, length in block_ranges(size, block_size)}
        present: dict[str, BlockState] = {}
        if resume:
            listing: BlockList = await ctx.request(lambda: store.get_block_list(plan.blob, "all"))
            for blk in listing.committed:
                if expected.get(blk.block_id) == blk.size:
                    present[blk.block_id] = BlockState.COMMITTED
            for blk in listing.uncommitted:
                if expected.get(blk.block_id) == blk.size:
                    present[blk.block_id] = BlockState.UNCOMMITTED
            ctx.journal.start_file(row.id, nonce=nonce, block_size=block_size, n_blocks=n, size=size,
                                   mtime_ns=plan.identity.mtime_ns, inode=plan.identity.inode, reset=False,
                                   ctime_ns=plan.identity.ctime_ns)

        whole = hashlib.md5() if ctx.config.put_md5 else None
        states = [BlockState.UNCOMMITTED] * n
        digests = [b""] * n  # xxh3-128 per block: the next version's delta compares against these
        delta = 0
        tasks: set[asyncio.Task[int]] = set()
        last_hash: asyncio.Future[None] | None = None
        reused = 0
        path = src.path
        reading: asyncio.Future[tuple[bytes | None, bytes]] | None = None
        # Reading further ahead than the requests that can be in flight only fills memory (and costs page
        # faults): a file keeps at most concurrency + 2 blocks read and not yet sent.
        window = Window(lambda: ctx.limiter.limit)
        try:
            for idx, offset, length in block_ranges(size, block_size):
                for task in [t for t in tasks if t.done()]:
                    if task.exception() is not None:
                        task.result()  # a failed block stops the file now, not after reading the rest
                    tasks.discard(task)
                await window.acquire()
                try:
                    buf = await ctx.memory.buffer(block_size)
                except BaseException:
                    window.release()
                    raise
                view = memoryview(buf)[:length]
                try:
                    old = base.block_at(idx, length) if base is not None else None
                    # A block the service holds already (resume) is only read for the whole-file MD5 and the
                    # delta memory: its own MD5 would cost ~1.4 s/GiB for nothing.
                    reading = loop.run_in_executor(ctx.io_pool, src.read_into, view, offset,
                                                   old[1] if old is not None else None, ids[idx] not in present)
                    md5, digests[idx] = await reading
                except BaseException:
                    if reading is not None and not reading.done():
                        await asyncio.wait([reading])  # the thread still writes into buf
                    ctx.memory.release(buf)
                    window.release()
                    raise
                if whole is not None:
                    last_hash = loop.run_in_executor(ctx.hash_pool, whole.update, view)
                bid = ids[idx]
                if old is not None and digests[idx] == old[1]:
                    # Unchanged since the committed version: name its committed block, send nothing.
                    kept = old[0]
                    ids[idx] = kept
                    expected[kept] = length
                    states[idx] = BlockState.COMMITTED
                    reused += length
                    delta += length
                    ctx.progress.advanced(row.rel, length, 0)
                    self._release_after(buf, last_hash)
                    window.release()
                elif bid in present:
                    states[idx] = present[bid]
                    reused += length
                    ctx.progress.advanced(row.rel, length, 0)
                    self._release_after(buf, last_hash)
                    window.release()
                else:
                    assert md5 is not None  # only an unchanged block skips its MD5
                    tasks.add(asyncio.create_task(
                        self._send_block(row, plan.blob, idx, bid, view, buf, md5, last_hash, window)))
            if tasks:
                await gather_or_cancel(tasks)
            if last_hash is not None:
                await last_hash
            if src.identity() != plan.identity:
                raise SourceChangedError(f"{path}: file changed while it was being uploaded; nothing committed")
        except BaseException:
            await cancel_all(tasks)
            raise

        whole_md5 = whole.digest() if whole is not None else None
        headers = replace(plan.headers, content_md5=whole_md5)
        entries = list(zip(ids, states, strict=True))
        # A delta names committed blocks of one exact version: commit only over that version.
        conditions = Conditions(if_match=base.etag) if base is not None else plan.conditions
        try:
            result = await ctx.request(lambda: store.put_block_list(plan.blob, entries, headers, conditions))
        except ConflictError:
            # A retried commit whose first try landed (the answer was lost) is refused by its own If-Match:
            # if the committed list is exactly ours (new IDs carry our fresh nonce), it was ours.
            landed = await ctx.request(lambda: store.get_block_list(plan.blob, "committed"))
            if base is None or [b.block_id for b in landed.committed] != ids or not landed.etag:
                raise
            result = PutResult(landed.etag, None)
        await self._verify(plan.blob, ids, expected, size, whole_md5)
        sent = size - reused
        ctx.journal.finish_file(row.id, "committed", md5_hex=whole_md5.hex() if whole_md5 else None,
                                etag=result.etag)
        lengths = [length for _, _, length in block_ranges(size, block_size)]
        ctx.journal.remember_commit(ctx.store.container_url, plan.blob, committed_record(
            block_size, result.etag, size, whole_md5, list(zip(ids, lengths, digests, strict=True))))
        notes = []
        if delta:
            notes.append(f"delta: {delta} bytes of unchanged blocks reused")
        if reused - delta:
            notes.append(f"resumed: {reused - delta} bytes were already on the service")
        return FileResult(row.rel, plan.blob, size, FileStatus.TRANSFERRED, bytes_sent=sent,
                          reason="; ".join(notes), bytes_delta=delta)

    def _release_after(self, buf: BlockBuffer, hashing: asyncio.Future[None] | None) -> None:
        if hashing is None or hashing.done():
            self.ctx.memory.release(buf)
        else:
            hashing.add_done_callback(lambda _: self.ctx.memory.release(buf))

    async def _send_block(
        self,
        row: FileRow,
        blob: str,
        idx: int,
        bid: str,
        view: memoryview,
        buf: BlockBuffer,
        md5: bytes,
        hashing: asyncio.Future[None] | None,
        window: Window,
    ) -> int:
        ctx = self.ctx
        try:
            await ctx.request(lambda: ctx.store.put_block(blob, bid, view, md5))
        finally:
            self._release_after(buf, hashing)
            window.release()
        ctx.journal.block_done(row.id, idx, len(view), md5.hex())
        ctx.progress.advanced(row.rel, len(view), len(view))
        return len(view)

    async def _verify(
        self, blob: str, ids: list[str], expected: dict[str, int], size: int, md5: bytes | None
    ) -> None:
        """Check what the service now holds against what was sent: block list, length and MD5."""
        ctx = self.ctx
        listing = await ctx.request(lambda: ctx.store.get_block_list(blob, "committed"))
        got = [(b.block_id, b.size) for b in listing.committed]
        if got != [(bid, expected[bid]) for bid in ids]:
            raise IntegrityError(f"{blob}: the committed block list differs from the one sent")
        props = await ctx.request(lambda: ctx.store.get_properties(blob))
        if props is None or props.size != size:
            raise IntegrityError(f"{blob}: the blob's length after commit is not {size}")
        if md5 is not None and props.content_md5 != md5:
            raise IntegrityError(f"{blob}: the blob's Content-MD5 after commit differs from the file's MD5")

    async def _clear_foreign_blocks(self, plan: _Plan) -> bool:
        """Discard uncommitted blocks whose IDs have another length, keeping any committed content."""
        ctx = self.ctx
        store = ctx.store
        listing = await ctx.request(lambda: store.get_block_list(plan.blob, "all"))
        if not any(len(b.block_id) != BLOCK_ID_LENGTH for b in listing.uncommitted):
            return False
        if listing.committed:
            props = await ctx.request(lambda: store.get_properties(plan.blob))
            if props is None:
                return False
            keep = [(b.block_id, BlockState.COMMITTED) for b in listing.committed]
            same = BlobHeaders(props.content_type or "application/octet-stream", props.content_md5,
                               props.metadata, None)
            result = await ctx.request(
                lambda: store.put_block_list(plan.blob, keep, same, Conditions(if_match=props.etag)))
        else:
            # No committed version: an empty commit discards the uncommitted blocks. The placeholder it
            # leaves is ours, so our own commit may replace it even under --overwrite false.
            result = await ctx.request(lambda: store.put_block_list(plan.blob, [], plan.headers, plan.conditions))
        if plan.conditions.if_none_match_any or plan.conditions.if_match:
            plan.conditions = Conditions(if_match=result.etag)
        return True


OCTET_STREAM = "application/octet-stream"
# Model and array formats: bytes for a program, never text or a type a browser would act on. The platform's table
# gets some wrong (.pt is 'application/vnd.snesdev-page-table' on Debian).
_BINARY_SUFFIXES = frozenset((".pt", ".pth", ".ckpt", ".safetensors", ".h5", ".hdf5", ".joblib", ".pkl", ".pickle",
                              ".onnx", ".npy", ".npz", ".parquet", ".bin", ".gguf", ".tflite", ".pb", ".msgpack"))


def _guess_type(path: Path) -> str:
    if path.suffix.lower() in _BINARY_SUFFIXES:
        return OCTET_STREAM
    guessed, _ = mimetypes.guess_type(path.name, strict=False)
    return guessed or OCTET_STREAM
