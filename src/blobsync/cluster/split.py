"""A file too big for one shard, spread over several workers: range tasks stage (or fetch) its blocks, one task
hashes it in order, and one task commits it once (a download: checks and renames the shared partial file).

Any task may run more than once (a worker died and the scheduler ran it again): staging asks the store what it
holds first, and the commit recognises its own earlier commit instead of failing."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

from blobsync.backends.base import BlobHeaders, PartCheck, Store
from blobsync.checksums import choose_check
from blobsync.cluster.spec import FileOutcome, RangeSpec, ShardReport
from blobsync.cluster.work import Publish, check_identity, shard_engine
from blobsync.config import CheckMd5
from blobsync.engine.commit import commit_checked, part_layout
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import WRITTEN_NOWHERE, check_md5, feed, new_md5
from blobsync.engine.fetching import FileSink, RangeFetch
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.s2s import copy_headers, source_tags
from blobsync.engine.staging import read_block
from blobsync.engine.tasks import for_each, in_thread
from blobsync.engine.upload import upload_headers
from blobsync.errors import BlobNotFoundError, BlobsyncError, ChecksumMismatchError, Scope
from blobsync.local.files import OpenFile
from blobsync.local.target import PartFile, safe_join


def _label(spec: RangeSpec) -> str:
    return f"{spec.file.rel} blocks {spec.first}-{spec.last - 1}"


def _path(spec: RangeSpec) -> Path:
    return Path(spec.job.local_root) / spec.file.rel


async def _range_task(spec: RangeSpec, publish: Publish | None, worker: str,
                      body: Callable[[EngineContext, Store | None], Awaitable[tuple[int, int]]]) -> ShardReport:
    """One range task: its engine (a journal keyed by the range), its body's bytes and bytes sent, its report."""
    started = time.monotonic()
    async with shard_engine(spec.job, f"{spec.file.nonce}-{spec.first}", _label(spec), publish) as (ctx, relay,
                                                                                                     source):
        nbytes, sent = await body(ctx, source)
    relay.flush()
    return ShardReport(_label(spec), worker, 0, nbytes, sent, time.monotonic() - started, ctx.requests.retrier.retries)


async def _file_task(spec: RangeSpec, step: str, before: tuple[ShardReport, ...], publish: Publish | None,
                     worker: str, body: Callable[[EngineContext, Store | None], Awaitable[None]]) -> ShardReport:
    """The task that ends a split file (its commit, or a download's finish), and the file's one outcome."""
    started, f = time.monotonic(), spec.file
    sent = sum(r.sent for r in before)
    outcome = FileOutcome(f.rel, True, sent)
    async with shard_engine(spec.job, f"{f.nonce}-{step}", f"{f.rel} {step}", publish) as (ctx, relay, source):
        try:
            await body(ctx, source)
        except BlobsyncError as exc:
            if exc.scope is not Scope.FILE:
                raise  # the scheduler runs the task again, or the job stops
            differed = exc.digest.hex() if isinstance(exc, ChecksumMismatchError) and exc.digest else ""
            outcome = FileOutcome(f.rel, False, sent, str(exc), int(exc.exit_code), digest=differed)
        relay.on_done_outcome(outcome)
    return ShardReport(f"{f.rel} {step}", worker, 1, 0, 0, time.monotonic() - started, ctx.requests.retrier.retries,
                       [outcome])


async def stage_range(spec: RangeSpec, publish: Publish | None, worker: str) -> ShardReport:
    """Stage blocks [first, last) of a file under the client's nonce, leaving those the store holds already."""
    f = spec.file

    async def stage(ctx: EngineContext, source: Store | None) -> tuple[int, int]:
        writer = ctx.store.writer(f.blob, f.nonce)
        tokens, expected = part_layout(writer, f.size, spec.block_size)
        held = await ctx.request(lambda: writer.parts())
        sent = 0
        if [p.token for p in held.committed] != tokens:  # else the commit landed already: nothing to stage
            present = {p.token for p in held.staged if expected.get(p.token) == p.size}
            if source is not None:  # a blob-to-blob copy: the destination's service reads each range
                sent = await stage_from_url(ctx, spec, source, present)
            else:
                sent = await _stage_blocks(ctx, spec, writer.stage, tokens, present)
        return sum(expected[t] for t in tokens[spec.first:spec.last]), sent

    return await _range_task(spec, publish, worker, stage)


async def _stage_blocks(ctx: EngineContext, spec: RangeSpec, stage: Callable[[int, memoryview, PartCheck | None],
                        Awaitable[None]], tokens: list[str], present: set[str]) -> int:
    f, path, size = spec.file, _path(spec), spec.block_size
    kind = choose_check(ctx.store.capabilities.part_checks, ctx.config.block_check)
    src = OpenFile(path, walked=f.inode or None, follow_symlinks=ctx.config.follow_symlinks,
                   root=Path(spec.job.local_root))
    sent = 0

    async def one(idx: int) -> None:
        nonlocal sent
        offset = idx * size
        length = min(size, f.size - offset)
        if tokens[idx] not in present:
            buf = await ctx.memory.buffer(size)
            view = memoryview(buf)[:length]
            try:
                check, _ = await in_thread(ctx.io_pool, read_block, src, view, offset, None, kind)
                await ctx.request(lambda: stage(idx, view, check))
            finally:
                ctx.memory.release(buf)
            sent += length
        ctx.progress.advanced(f.rel, length, length if tokens[idx] not in present else 0)

    try:
        check_identity(path, f)
        await for_each(range(spec.first, spec.last), one, max(1, ctx.config.start_concurrency))
        check_identity(path, f)  # no block of another version is staged under this version's nonce
    finally:
        src.close()
    return sent


def hash_file(spec: RangeSpec) -> str:
    """The whole file's MD5 (hex), read in order beside the range tasks: a blob's Content-MD5 cannot be made of
    the parts' MD5s."""
    path = _path(spec)
    check_identity(path, spec.file)
    src = OpenFile(path, walked=spec.file.inode or None,
                   follow_symlinks=bool(spec.job.options.get("follow_symlinks", False)), root=Path(spec.job.local_root))
    try:
        digest = new_md5()
        for offset, length in _steps(spec.file.size):
            buf = bytearray(length)
            src.read_into(memoryview(buf), offset)
            digest.update(buf)
    finally:
        src.close()
    check_identity(path, spec.file)
    return digest.digest().hex()


def _steps(size: int, step: int = 8 * 1024 * 1024) -> Iterator[tuple[int, int]]:
    for offset in range(0, size, step):
        yield offset, min(step, size - offset)


async def commit_split(spec: RangeSpec, md5_hex: str | None, *staged: ShardReport, publish: Publish | None,
                       worker: str) -> ShardReport:
    """Commit every block of the file, in order, once all range tasks are done; then verify what the store holds."""

    async def commit(ctx: EngineContext, source: Store | None) -> None:
        if source is not None:
            await commit_copy(ctx, spec, source)
        else:
            await _commit(ctx, spec, bytes.fromhex(md5_hex) if md5_hex else None)

    return await _file_task(spec, "commit", staged, publish, worker, commit)


async def _commit(ctx: EngineContext, spec: RangeSpec, md5: bytes | None) -> None:
    f, path = spec.file, _path(spec)
    ident = check_identity(path, f)
    headers = replace(upload_headers(ctx.config, path, ident), content_md5=md5)
    await _commit_all(ctx, spec, headers)


async def _commit_all(ctx: EngineContext, spec: RangeSpec, headers: BlobHeaders) -> None:
    """Every part of the file in order (a task run again finds its own commit); the job stages them again when
    they are gone and no commit of ours landed."""
    writer = ctx.store.writer(spec.file.blob, spec.file.nonce)
    tokens, expected = part_layout(writer, spec.file.size, spec.block_size)
    await commit_checked(ctx, writer, spec.file.blob, [(t, False) for t in tokens], expected, headers)


async def fetch_range(spec: RangeSpec, publish: Publish | None, worker: str) -> ShardReport:
    """Fetch blocks [first, last) of a blob (If-Match the planned version) into the shared partial file."""
    f, size = spec.file, spec.block_size

    async def fetch(ctx: EngineContext, _source: Store | None) -> tuple[int, int]:
        part = await _shared_part(ctx, spec)
        ranges = [(i, i * size, min(size, f.size - i * size)) for i in range(spec.first, spec.last)]
        reads = RangeFetch(ctx, f.rel, f.blob, f.etag or None, ranges, FileSink(ctx, part, None), None)
        try:
            sent = await reads.run()
            await in_thread(ctx.io_pool, part.sync)
        finally:
            part.close()
        return sent, sent

    return await _range_task(spec, publish, worker, fetch)


async def finish_download(spec: RangeSpec, *fetched: ShardReport, publish: Publish | None, worker: str
                          ) -> ShardReport:
    """Check the whole partial file's MD5 against the blob's, then give it its name: one rename, once whole."""
    f = spec.file

    async def finish(ctx: EngineContext, _source: Store | None) -> None:
        props, mode = f.listed(), ctx.config.check_md5
        part = await _shared_part(ctx, spec)
        try:
            digest = None  # hashed only where a stored MD5 is there to compare it with
            if props.content_md5 is not None and mode is not CheckMd5.NO_CHECK:
                whole = new_md5()
                await in_thread(ctx.io_pool, feed, whole, part.chunks(0, f.size))
                digest = whole.digest()
            check_md5(mode, f.blob, props.content_md5, digest, WRITTEN_NOWHERE)
            mtime = destination_mtime_ns(props) if ctx.config.preserve_last_modified_time else None
            await in_thread(ctx.io_pool, part.finish, mtime)
        except BlobsyncError:
            part.discard()
            raise
        finally:
            part.close()

    return await _file_task(spec, "finish", fetched, publish, worker, finish)


async def _shared_part(ctx: EngineContext, spec: RangeSpec) -> PartFile:
    """The split download's one partial file, which every range task writes its ranges into."""
    target = safe_join(Path(spec.job.local_root), spec.file.rel)
    base = Path(spec.job.base or spec.job.local_root)  # no link below the folder the user named
    return await in_thread(ctx.io_pool, lambda: PartFile(target, spec.file.size, keep=True, root=base, shared=True))


# --- blob-to-blob copies: the destination's service reads each range from the source's URL ---


async def stage_from_url(ctx: EngineContext, spec: RangeSpec, source: Store, present: set[str]) -> int:
    """Stage blocks [first, last) of the copy as ranges the destination's service reads from the source (at the
    version listed), leaving those the store holds already; the bytes staged."""
    f = spec.file
    writer = ctx.store.writer(f.blob, f.nonce)
    copy_source = await source.copy_source(f.source, f.etag or None, ctx.store.location)
    staged = 0

    async def one(idx: int) -> None:
        nonlocal staged
        offset = idx * spec.block_size
        length = min(spec.block_size, f.size - offset)
        if writer.token(idx) not in present:
            await ctx.request(lambda: writer.stage_from(idx, copy_source, offset, length))
            staged += length
        ctx.progress.advanced(f.rel, length, 0)

    await for_each(range(spec.first, spec.last), one, max(1, ctx.config.start_concurrency))
    return staged


async def commit_copy(ctx: EngineContext, spec: RangeSpec, source: Store) -> None:
    """Commit every part of the copy in order with the source's properties, then verify what the store holds."""
    f = spec.file
    props = await ctx.request(lambda: source.stat(f.source))
    # A listing gives ETags bare, a HEAD quoted (as HTTP has them): the same version either way.
    if props is None or props.etag.strip('"') != (f.etag or "").strip('"'):
        raise BlobNotFoundError(f"{f.source}: the source blob is gone or changed since it was listed; run again",
                                status=404, code="BlobNotFound")
    tags = await source_tags(ctx.config, source, ctx, f.source)
    await _commit_all(ctx, spec, replace(copy_headers(ctx.config, props, ctx.store.capabilities), tags=tags))
