"""Uploads one local file: a single put when small, else a resumable chunked write (engine/staging.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import mimetypes
from dataclasses import replace
from pathlib import Path, PurePath

from blobsync.backends.base import BlobHeaders, Buffer, Conditions, PutResult
from blobsync.config import TransferConfig
from blobsync.engine.blocks import block_count, choose_block_size, new_nonce
from blobsync.engine.chunks import BlockWrite, UploadPlan, check_expected
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import DeltaBase, find_base
from blobsync.engine.digest import md5_of
from blobsync.engine.mtime import MTIME_KEY, format_mtime
from blobsync.engine.overwrite import EXISTS, created_meanwhile, created_only, write_conditions
from blobsync.engine.prior import DIGEST_HEX, SUFFIX, PriorBlocks, encode, find_prior, prior_name
from blobsync.engine.staging import BlockUploader
from blobsync.engine.tasks import in_thread
from blobsync.errors import (
    BlobsyncError,
    ConflictError,
    IntegrityError,
    InvalidBlockListError,
    SourceChangedError,
)
from blobsync.journal import FileRow, FileState
from blobsync.local.files import INLINE_READ_MAX, FileIdentity, OpenFile, Source
from blobsync.report import FileResult, FileStatus, blob_url

log = logging.getLogger("blobsync")

_ATTEMPTS = 3  # chunked writes of one file: the first, and two after the store lost or refused staged parts


def file_md5(path: Path, planned: FileIdentity, *, follow_symlinks: bool, root: Path | None) -> bytes:
    """The MD5 of a file read in order, opened only as `planned` names it (its inode, no link unless followed) and
    still that version at the end (a split file's hash task: its ranges are staged beside it). The next step is
    read in a thread while this one is hashed (both leave the GIL): the task runs at the MD5's own pace."""
    src = OpenFile(path, walked=planned.inode or None, follow_symlinks=follow_symlinks, root=root)
    size = planned.size
    bufs = [bytearray(min(size, _HASH_STEP) or 1) for _ in range(2)]

    def read(step: int) -> memoryview:
        offset = step * _HASH_STEP
        view = memoryview(bufs[step % 2])[:min(_HASH_STEP, size - offset)]
        src.read_into(view, offset)
        return view

    try:
        digest = hashlib.md5()
        steps = -(-size // _HASH_STEP)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blobsync-hash-read") as reader:
            ahead = reader.submit(read, 0) if steps else None
            for step in range(steps):
                assert ahead is not None
                view = ahead.result()
                ahead = reader.submit(read, step + 1) if step + 1 < steps else None
                digest.update(view)  # the other buffer is being filled meanwhile
        if (src.identity().size, src.identity().mtime_ns) != (planned.size, planned.mtime_ns):
            raise SourceChangedError(f"{path}: file changed while it was being hashed; nothing committed")
        return digest.digest()
    finally:
        src.close()


_HASH_STEP = 8 * 1024 * 1024


def _read_small(src: Source, size: int) -> tuple[bytes, bytes]:
    data = src.read_all(size)
    return data, md5_of(data)


class FileUploader:
    """Uploads files of one job. Errors that concern only the file are raised as such; callers decide."""

    def __init__(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.blocks = BlockUploader(ctx)

    async def upload(self, row: FileRow, path: Path, walked: int | None = None, root: Path | None = None
                     ) -> FileResult:
        """Upload `path`; `walked`: the inode a walk listed it with (it is opened only if it is still that file,
        and not through a link unless --follow-symlinks, no folder below `root` either)."""
        self.ctx.store.check_name(row.blob)
        src = OpenFile(path, walked=walked, follow_symlinks=self.ctx.config.follow_symlinks, root=root)
        try:
            return await self._upload(row, src)
        finally:
            src.close()  # every read of it has finished by now, even on cancellation

    async def upload_source(self, row: FileRow, src: Source, *, headers: BlobHeaders | None = None,
                            conditions: Conditions | None = None, expected_md5: bytes | None = None) -> FileResult:
        """Upload what `src` holds (bytes in memory, a file object, another store's blob) as the blob `row` names;
        `headers` and `conditions` replace those the config gives, and the bytes read must have `expected_md5`."""
        self.ctx.store.check_name(row.blob)
        return await self._upload(row, src, headers, conditions, expected_md5)

    async def _upload(self, row: FileRow, src: Source, headers: BlobHeaders | None = None,
                      conditions: Conditions | None = None, expected_md5: bytes | None = None) -> FileResult:
        identity = src.opened
        decided = conditions or await write_conditions(self.ctx, row.blob, identity.mtime_ns, row.nonce)
        if isinstance(decided, str):
            return self._skipped(row, identity, decided)
        plan = UploadPlan(row.blob, identity, headers or self._headers(src.path, identity), decided, expected_md5)
        if identity.size <= self.ctx.config.single_put_limit:
            return await self._put_single(row, src, plan)
        return await self._put_blocks(row, src, plan)

    async def stage_window(self, row: FileRow, path: Path, planned: FileIdentity, root: Path | None, nonce: str,
                           block_size: int, base: DeltaBase | None, window: tuple[int, int]) -> BlockWrite:
        """Stage blocks [first, last) of `path` under `nonce` (a split file's range task: its commit is another
        task's), with the engine's own reads, checks, resume and delta. The file must still be the one `planned`
        names (its inode, size and mtime), or nothing of it is staged."""
        self.ctx.store.check_name(row.blob)
        src = OpenFile(path, walked=planned.inode or None, follow_symlinks=self.ctx.config.follow_symlinks, root=root)
        try:
            ident = src.opened
            if (ident.size, ident.mtime_ns) != (planned.size, planned.mtime_ns):
                raise SourceChangedError(f"{path}: file changed since the job was planned; nothing of it is staged")
            plan = UploadPlan(row.blob, ident, self._headers(path, ident), Conditions())
            w = BlockWrite(row, plan, nonce, self.ctx.store.writer(row.blob, nonce), block_size, base,
                           first=window[0], last=window[1])
            await self.blocks.stage_window(w, src)
            return w
        finally:
            src.close()

    def _headers(self, path: PurePath, identity: FileIdentity) -> BlobHeaders:
        return upload_headers(self.ctx.config, path, identity)

    def _skipped(self, row: FileRow, identity: FileIdentity, reason: str) -> FileResult:
        return FileResult(row.rel, row.blob, identity.size, FileStatus.SKIPPED, reason=reason)

    # --- small files --------------------------------------------------------------------------------------

    async def _put_single(self, row: FileRow, src: Source, plan: UploadPlan) -> FileResult:
        ctx = self.ctx
        before = plan.identity
        reserved = await ctx.memory.reserve(before.size)
        try:
            # A small file already in the page cache is read and hashed on the loop: cheaper than the hand-off to
            # a worker thread and back. One that would wait for the disk goes to a thread like the big ones.
            cached = src.read_all_cached(before.size) if before.size <= INLINE_READ_MAX else None
            data: bytes | bytearray
            if cached is not None:
                data, md5 = cached, md5_of(cached)
            else:
                data, md5 = await in_thread(ctx.io_pool, _read_small, src, before.size)
            if src.identity() != before:
                raise SourceChangedError(f"{src.path}: file changed while it was being read")
            check_expected(plan, md5)
            result = await put_once(ctx, row.rel, plan.blob, data, md5, plan.headers, plan.conditions)
        finally:
            ctx.memory.unreserve(reserved)
        if result.status is FileStatus.SKIPPED:
            return result
        # What was sent (a later run of the job knows it by this identity); the runner records the outcome.
        ctx.journal.start_file(row.id, nonce=None, block_size=None, n_blocks=None, size=before.size,
                               mtime_ns=before.mtime_ns, inode=before.inode, reset=True)
        ctx.journal.forget_commit(ctx.store.container_url, plan.blob)
        return result

    # --- chunked writes -----------------------------------------------------------------------------------

    async def _put_blocks(self, row: FileRow, src: Source, plan: UploadPlan) -> FileResult:
        ident = plan.identity
        nonce, block_size = row.nonce, row.block_size
        resume = _resumable(row, ident)
        base = await find_base(self.ctx, plan.blob, ident.size)
        if base is not None and resume and block_size != base.block_size:
            base = None  # an interrupted transfer of this very source goes on as it began
        prior, note = await self._prior(row, block_size if resume else None)
        attempt = 0  # a delta that falls back to a full upload does not count as one
        while True:
            if not resume or nonce is None or block_size is None:
                nonce, block_size = self._start_fresh(row, plan, base, prior.block_size if prior else None)
            writer = self.ctx.store.writer(plan.blob, nonce)
            w = BlockWrite(row, plan, nonce, writer, block_size, base)
            if prior is not None and prior.block_size == block_size:
                w.prior = prior
            w.prior_note = note
            try:
                return await self._run(w, src, resume)
            except SourceChangedError:
                # The parts staged hold bytes of a version that no longer exists: no run will resume them.
                with contextlib.suppress(BlobsyncError):
                    await self.ctx.request(writer.abort)
                raise
            except (ConflictError, InvalidBlockListError) as exc:
                if base is not None:
                    # The version the delta built on changed under us (412) or lacks a part it named: send the
                    # whole file under this nonce, keeping the changed blocks already staged.
                    log.info("%s: delta commit refused (%s): full upload", plan.blob, exc.code)
                    base, resume = None, True
                    continue
                # Staged parts vanished before the commit (expired, discarded, service restarted): ask the
                # store what it still has and send the rest again.
                if isinstance(exc, ConflictError) or attempt == _ATTEMPTS - 1:
                    raise
                resume = True
            attempt += 1

    async def _run(self, w: BlockWrite, src: Source, resume: bool) -> FileResult:
        result = await self.blocks.run(w, src, resume)
        if self.ctx.config.block_digests:
            await record_blocks(self.ctx, w, result.etag)
        return result

    async def _prior(self, row: FileRow, block_size: int | None) -> tuple[PriorBlocks | None, str]:
        """The earlier blob whose unchanged blocks the service may stage for this file (config.blocks_from), and
        why there is none where one was asked for."""
        cfg = self.ctx.config
        if cfg.blocks_from is None:
            return None, ""
        prior, note = await find_prior(self.ctx, prior_name(cfg.blocks_from, row.rel if cfg.recursive else None),
                                       block_size)
        return prior, f"incremental: sent whole: {note}" if note else ""

    def _start_fresh(self, row: FileRow, plan: UploadPlan, base: DeltaBase | None,
                     prior_block_size: int | None = None) -> tuple[str, int]:
        """A new nonce (and block size) for the file, journaled before the first part leaves."""
        size = plan.identity.size
        if prior_block_size and block_count(size, prior_block_size) > self.ctx.store.capabilities.max_parts:
            prior_block_size = None  # outgrew the earlier blob's blocks: sent whole, in blocks of its own
        # A delta keeps the committed block size, and an incremental write its earlier blob's: auto-sizing must not
        # shift every block boundary.
        block_size = base.block_size if base is not None else prior_block_size or choose_block_size(
            size, self.ctx.config.block_size, self.ctx.store.capabilities)
        n = block_count(size, block_size)
        nonce = new_nonce()
        if base is not None:  # no new part may carry the identity of a committed part the delta keeps
            kept = {token for token, _, _ in base.blocks}
            while any(self.ctx.store.writer(plan.blob, nonce).token(i) in kept for i in range(n)):
                nonce = new_nonce()
        ident = plan.identity
        self.ctx.journal.start_file(row.id, nonce=nonce, block_size=block_size, n_blocks=n, size=size,
                                    mtime_ns=ident.mtime_ns, inode=ident.inode, reset=True, ctime_ns=ident.ctime_ns)
        # The nonce must be durable before the first part leaves, or a crash orphans the parts.
        self.ctx.journal.flush()
        return nonce, block_size


async def put_once(ctx: EngineContext, rel: str, blob: str, data: Buffer, md5: bytes, headers: BlobHeaders,
                   conditions: Conditions) -> FileResult:
    """The one Put Blob outside the backends: `data` whole, its MD5 sent for the service to check and compared
    with the one it stored. A create-only write refused because the blob exists on a second try counts as done when
    the blob holds these very bytes (the first try's answer was lost); else it is SKIPPED with the reason."""
    size = memoryview(data).nbytes
    headers = replace(headers, content_md5=md5)
    tries = 0

    async def attempt() -> PutResult:
        nonlocal tries
        tries += 1
        return await ctx.store.put(blob, data, headers, conditions)

    try:
        result = await ctx.request(attempt)
    except ConflictError as exc:
        if not created_only(exc, conditions):
            raise
        if tries == 1:
            return FileResult(rel, blob, size, FileStatus.SKIPPED, reason=EXISTS)
        landed = await created_meanwhile(ctx, blob, size, md5)
        if isinstance(landed, str):
            return FileResult(rel, blob, size, FileStatus.SKIPPED, reason=landed)
        result = PutResult(landed.etag, landed.content_md5)
    if result.content_md5 is not None and result.content_md5 != md5:
        raise IntegrityError(f"{blob}: the service stored a different MD5 than was sent")
    ctx.progress.advanced(rel, size, size)
    return FileResult(rel, blob, size, FileStatus.TRANSFERRED, bytes_sent=size, etag=result.etag, content_md5=md5,
                      url=blob_url(ctx.store.container_url, blob), version_id=result.version_id)


def _resumable(row: FileRow, ident: FileIdentity) -> bool:
    """Whether the journal's chunked write of this file goes on: only the same source with the same nonce; anything
    else starts clean with a new nonce."""
    same_source = (row.size, row.mtime_ns, row.inode, row.ctime_ns) == (ident.size, ident.mtime_ns, ident.inode,
                                                                        ident.ctime_ns)
    return bool(row.nonce and row.block_size and same_source
                and row.state in (FileState.ACTIVE, FileState.FAILED, FileState.COMMITTED))


async def record_blocks(ctx: EngineContext, w: BlockWrite, etag: str | None) -> None:
    """Write the digests of a committed write's blocks beside its blob (`<blob>.blocks`): what a later write's
    `blocks_from` compares with. A failure is logged, not raised: the blob is whole, only the next write sends
    more."""
    if not etag or not w.digests or any(len(d) != DIGEST_HEX // 2 for d in w.digests):
        return
    data = encode(etag, w.size, w.block_size, w.digests)
    try:
        await put_once(ctx, w.rel, w.plan.blob + SUFFIX, data, md5_of(data),
                       BlobHeaders("application/json", None, {}), Conditions())
    except BlobsyncError as exc:
        log.warning("%s: its block digests were not written (%s): the next incremental write sends it whole",
                    w.plan.blob, exc.message)


def written(result: FileResult) -> FileResult:
    """A put's result as a library call answers it: what landed, or ConflictError if the blob was left alone."""
    if result.status is FileStatus.SKIPPED:
        raise ConflictError(f"blob {result.blob!r} exists: not overwritten ({result.reason})", status=409,
                            code="BlobAlreadyExists")
    return result


def upload_headers(cfg: TransferConfig, path: PurePath, identity: FileIdentity) -> BlobHeaders:
    """The properties an uploaded file's blob gets: content type, metadata (with the source's mtime), tier, ..."""
    content_type = cfg.content_type or (_guess_type(path) if cfg.guess_mime_type else OCTET_STREAM)
    metadata = {**cfg.metadata, MTIME_KEY: format_mtime(identity.mtime_ns)}
    return BlobHeaders(content_type, None, metadata, cfg.tier, cfg.properties, cfg.blob_tags)


OCTET_STREAM = "application/octet-stream"
# Model and array formats: bytes for a program, never text or a type a browser would act on. The platform's table
# gets some wrong (.pt is 'application/vnd.snesdev-page-table' on Debian).
_BINARY_SUFFIXES = frozenset((".pt", ".pth", ".ckpt", ".safetensors", ".h5", ".hdf5", ".joblib", ".pkl", ".pickle",
                              ".onnx", ".npy", ".npz", ".parquet", ".bin", ".gguf", ".tflite", ".pb", ".msgpack"))


def _guess_type(path: PurePath) -> str:
    if path.suffix.lower() in _BINARY_SUFFIXES:
        return OCTET_STREAM
    guessed, _ = mimetypes.guess_type(path.name, strict=False)
    return guessed or OCTET_STREAM

