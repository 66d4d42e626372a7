"""A blob-to-blob copy's work on a worker: shards of whole blobs through the engine's copier, and the ranges and
the commit of a blob too big for one shard, staged from the source's URL by several workers."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

from blobsync.backends.base import BlobProperties, Store
from blobsync.backends.registry import open_store
from blobsync.cluster.spec import JobSpec, RangeSpec, ShardFile, ShardSpec
from blobsync.config import TransferConfig
from blobsync.engine.context import EngineContext
from blobsync.engine.listing import as_properties
from blobsync.engine.plan import block_count, block_ranges
from blobsync.engine.s2s import BlobCopier, copy_block_size, copy_headers, one_request, source_tags
from blobsync.engine.staging import verify_commit
from blobsync.engine.tasks import for_each
from blobsync.errors import BlobNotFoundError, InvalidBlockListError
from blobsync.jobs.runner import WorkItem
from blobsync.journal import FileRow, FileState
from blobsync.journal.index import Entry


@contextlib.asynccontextmanager
async def source_store(job: JobSpec, config: TransferConfig) -> AsyncIterator[Store]:
    """The copy's source store on this worker (its URL's SAS, or this machine's environment)."""
    store = open_store(job.source_url, config, os.environ)
    try:
        yield store
    finally:
        await store.close()


def listed(f: ShardFile) -> BlobProperties:
    """The source blob as the client listed it (name, size, version, MD5, mtime)."""
    return as_properties(Entry(f.rel, f.size, f.mtime_ns, f.exact_mtime, bytes.fromhex(f.md5) if f.md5 else None,
                               f.etag, f.source))


def copy_items(ctx: EngineContext, spec: ShardSpec, rows: dict[str, FileRow], source: Store) -> Iterator[WorkItem]:
    """The shard's blobs, each through the copier; a staged one takes the client's nonce, so that a rerun of the
    shard (here or on another worker) finds the parts an earlier run staged."""
    copier = BlobCopier(ctx, source)
    caps = ctx.store.capabilities
    for f in spec.files:
        row = rows[f.rel]
        if row.state is FileState.COMMITTED:
            continue
        if not one_request(ctx.config, caps, f.size) and row.nonce is None:
            block = copy_block_size(ctx.config, caps, f.size)
            ctx.journal.start_file(row.id, nonce=f.nonce, block_size=block, n_blocks=block_count(f.size, block),
                                   size=f.size, mtime_ns=f.mtime_ns, inode=0, reset=True, etag=f.etag)
            ctx.journal.flush()
            row = replace(row, nonce=f.nonce, block_size=block, etag=f.etag, state=FileState.ACTIVE)
        yield WorkItem(row, f.size, functools.partial(copier.copy, row, listed(f)))


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
    if props is None or props.etag.strip('"') != f.etag.strip('"'):
        raise BlobNotFoundError(f"{f.source}: the source blob is gone or changed since it was listed; run again",
                                status=404, code="BlobNotFound")
    writer = ctx.store.writer(f.blob, f.nonce)
    tokens = [writer.token(i) for i in range(block_count(f.size, spec.block_size))]
    expected = {tokens[i]: length for i, _, length in block_ranges(f.size, spec.block_size)}
    tags = await source_tags(ctx.config, source, ctx, f.source)
    headers = replace(copy_headers(ctx.config, props, ctx.store.capabilities), tags=tags)
    try:
        await ctx.request(lambda: writer.commit([(t, False) for t in tokens], headers))
    except InvalidBlockListError:
        landed = await ctx.request(lambda: writer.parts(staged=False))
        if [p.token for p in landed.committed] != tokens:
            raise  # the staged parts are gone and no commit of ours landed: the job stages them again
    await verify_commit(ctx, writer, f.blob, tokens, expected, f.size, headers.content_md5)
