"""A file too big for one shard, spread over several workers: range tasks stage (or fetch) its blocks, one task
hashes it in order, and one task commits it once (a download: checks and renames the shared partial file).

Any task may run more than once (a worker died and the scheduler ran it again): staging asks the store what it
holds first, and the commit recognises its own earlier commit instead of failing."""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from blobsync.backends.base import NO_CONDITIONS, BlobHeaders, ChunkedWriter, Conditions, PutResult, Store
from blobsync.checksums import crc64_int
from blobsync.cluster.spec import FileOutcome, RangeSpec, ShardReport
from blobsync.cluster.work import Publish, Relay, check_identity, shard_engine
from blobsync.engine.blocks import block_count
from blobsync.engine.chunks import BlockWrite
from blobsync.engine.commit import commit_checked, part_layout
from blobsync.engine.context import EngineContext
from blobsync.engine.delta import DeltaBase, committed_record
from blobsync.engine.digest import (
    WRITTEN_NOWHERE,
    Digest,
    crc64_digest,
    crc64_metadata,
    feed,
    new_md5,
    verify_read,
    whole_check,
)
from blobsync.engine.download import shared_part
from blobsync.engine.fetching import FileSink, RangeFetch
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.engine.s2s import ServiceParts, copy_headers, source_tags
from blobsync.engine.tasks import in_thread
from blobsync.engine.upload import FileUploader, file_md5, upload_headers
from blobsync.errors import (
    BlobNotFoundError,
    BlobsyncError,
    ChecksumMismatchError,
    ConflictError,
    InvalidBlockListError,
    Scope,
)
from blobsync.jobs.ops import FileOp
from blobsync.journal import FileRow, JobKind
from blobsync.local.files import FileIdentity
from blobsync.local.target import PartFile, safe_join

log = logging.getLogger("blobsync")


def _label(spec: RangeSpec) -> str:
    return f"{spec.file.rel} blocks {spec.first}-{spec.last - 1}"


def _path(spec: RangeSpec) -> Path:
    return Path(spec.job.local_root) / spec.file.rel


Block = tuple[int, str, bool, str, str]  # see ShardReport.blocks
Staged = tuple[int, int, list[Block]]  # bytes, bytes sent, each block


async def _range_task(spec: RangeSpec, publish: Publish | None, worker: str,
                      body: Callable[[EngineContext, Store | None, Relay], Awaitable[Staged]]) -> ShardReport:
    """One range task: its engine (a journal keyed by the range), its body's bytes and bytes sent, its report."""
    started = time.monotonic()
    async with shard_engine(spec.job, f"{spec.file.nonce}-{spec.first}", _label(spec), publish) as (ctx, relay,
                                                                                                     source):
        nbytes, sent, blocks = await body(ctx, source, relay)
    relay.flush()
    return ShardReport(_label(spec), worker, 0, nbytes, sent, time.monotonic() - started, ctx.requests.retrier.retries,
                       blocks=blocks)


async def _file_task(spec: RangeSpec, step: str, before: tuple[ShardReport, ...], publish: Publish | None,
                     worker: str, body: Callable[[EngineContext, Store | None, FileOutcome], Awaitable[None]]
                     ) -> ShardReport:
    """The task that ends a split file (its commit, or a download's finish), and the file's one outcome (which
    the body fills in with what landed: version, MD5, commit record)."""
    started, f = time.monotonic(), spec.file
    sent = sum(r.sent for r in before)
    outcome = FileOutcome(f.rel, True, sent)
    async with shard_engine(spec.job, f"{f.nonce}-{step}", f"{f.rel} {step}", publish) as (ctx, relay, source):
        try:
            await body(ctx, source, outcome)
        except BlobsyncError as exc:
            if exc.scope is not Scope.FILE:
                raise  # the scheduler runs the task again, or the job stops
            differed = exc.digest.hex() if isinstance(exc, ChecksumMismatchError) and exc.digest else ""
            outcome = FileOutcome(f.rel, False, sent, str(exc), int(exc.exit_code), digest=differed)
        relay.on_done_outcome(outcome)
    return ShardReport(f"{f.rel} {step}", worker, 1, 0, 0, time.monotonic() - started, ctx.requests.retrier.retries,
                       [outcome])


async def stage_range(spec: RangeSpec, publish: Publish | None, worker: str) -> ShardReport:
    """Stage blocks [first, last) of a file under the client's nonce with the engine's own steps over that window
    (engine/staging.BlockUploader: resume, delta, checks); a copy's ranges are staged by the destination's service."""
    f = spec.file

    async def stage(ctx: EngineContext, source: Store | None, _relay: Relay) -> Staged:
        writer = ctx.store.writer(f.blob, f.nonce)
        tokens, expected = part_layout(writer, f.size, spec.block_size)
        nbytes = sum(expected[t] for t in tokens[spec.first:spec.last])
        if source is None:
            w = await _stage_window(ctx, spec, (spec.first, spec.last), _delta_base(f, spec.block_size))
            return nbytes, nbytes - w.reused, _blocks_of(w, range(spec.first, spec.last))
        held = await ctx.request(lambda: writer.parts())
        if [p.token for p in held.committed] == tokens:  # the commit landed already: nothing to stage
            present = set(tokens)
        else:
            present = {p.token for p in held.staged if expected.get(p.token) == p.size}
        return nbytes, await stage_from_url(ctx, spec, source, present), []

    return await _range_task(spec, publish, worker, stage)


def _delta_base(f: FileOp, block_size: int) -> DeltaBase | None:
    record = f.delta
    if record is None or record.block_size != block_size:
        return None
    return DeltaBase(record.block_size, record.etag, record.blocks)


async def _stage_window(ctx: EngineContext, spec: RangeSpec, window: tuple[int, int], base: DeltaBase | None
                        ) -> BlockWrite:
    """The engine's chunked write of the file over `window`, journaled in this task's own journal."""
    f = spec.file
    planned = FileIdentity(f.size, f.mtime_ns, f.inode)
    return await FileUploader(ctx).stage_window(_task_row(ctx, spec, JobKind.UPLOAD), _path(spec), planned,
                                                Path(spec.job.local_root), f.nonce, spec.block_size, base, window)


def _task_row(ctx: EngineContext, spec: RangeSpec, kind: JobKind) -> FileRow:
    """The file's row in this task's own journal (what the engine's steps journal their parts in)."""
    f = spec.file
    job = ctx.journal.create_job(kind, spec.job.local_root, f"{f.blob}#{f.nonce}/{spec.first}", {})
    return ctx.journal.add_files(job.id, [(f.rel, f.blob, f.size, f.mtime_ns, f.inode)])[f.rel]


def _blocks_of(w: BlockWrite, indexes: range) -> list[Block]:
    """Each block of the window as the commit and the next delta need it: (index, part token, whether that part is
    committed already, xxh3-128 hex, CRC64 hex or "")."""
    return [(i, w.tokens[i], w.kept[i], w.digests[i].hex(), "" if w.crcs[i] is None else f"{w.crcs[i]:016x}")
            for i in indexes]


def hash_file(spec: RangeSpec) -> str:
    """The whole file's MD5 (hex), read in order beside the range tasks: a blob's Content-MD5 cannot be made of
    the parts' MD5s."""
    path, f = _path(spec), spec.file
    check_identity(path, f)
    md5 = file_md5(path, FileIdentity(f.size, f.mtime_ns, f.inode),
                   follow_symlinks=bool(spec.job.options.get("follow_symlinks", False)), root=Path(spec.job.local_root))
    check_identity(path, f)
    return md5.hex()


async def commit_split(spec: RangeSpec, md5_hex: str | None, *staged: ShardReport, publish: Publish | None,
                       worker: str) -> ShardReport:
    """Commit every block of the file, in order, once all range tasks are done; then verify what the store holds."""

    async def commit(ctx: EngineContext, source: Store | None, outcome: FileOutcome) -> None:
        if source is not None:
            outcome.etag = await commit_copy(ctx, spec, source)
        else:
            await _commit(ctx, spec, bytes.fromhex(md5_hex) if md5_hex else None, staged, outcome)

    return await _file_task(spec, "commit", staged, publish, worker, commit)


async def _commit(ctx: EngineContext, spec: RangeSpec, md5: bytes | None, staged: tuple[ShardReport, ...],
                  outcome: FileOutcome) -> None:
    """Commit the blocks the range tasks staged or kept, over the committed version a delta named (If-Match);
    if that version changed meanwhile, the whole file is staged again (the parts there kept) and committed.
    The outcome gets the version written and the record the next delta builds on."""
    f, path = spec.file, _path(spec)
    ident = check_identity(path, f)
    writer = ctx.store.writer(f.blob, f.nonce)
    tokens, lengths = part_layout(writer, f.size, spec.block_size)
    blocks = _reported(staged, len(tokens)) or [(i, t, False, "", "") for i, t in enumerate(tokens)]
    headers = upload_headers(ctx.config, path, ident)
    base = _delta_base(f, spec.block_size)
    try:
        result = await _commit_blocks(ctx, writer, f.blob, blocks, lengths, headers, md5, base)
    except (ConflictError, InvalidBlockListError):
        if not any(b[1] != tokens[b[0]] for b in blocks):
            raise
        log.info("%s: the blob changed since blobsync committed it: its unchanged blocks are sent too", f.blob)
        w = await _stage_window(ctx, spec, (0, len(tokens)), None)
        outcome.sent += f.size - w.reused
        blocks = _blocks_of(w, range(len(tokens)))
        result = await _commit_blocks(ctx, writer, f.blob, blocks, lengths, headers, md5, None)
    outcome.etag, outcome.md5 = result.etag, md5.hex() if md5 else ""
    outcome.delta = sum(lengths[tokens[i]] for i, token, _, _, _ in blocks if token != tokens[i])
    if all(b[3] for b in blocks):  # each block as committed: its ID, length and digest
        outcome.commit = committed_record(spec.block_size, result.etag, f.size, md5, [
            (token, lengths[tokens[i]], bytes.fromhex(xxh)) for i, token, _, xxh, _ in blocks])


async def _commit_blocks(ctx: EngineContext, writer: ChunkedWriter, blob: str, blocks: list[Block],
                         lengths: dict[str, int], headers: BlobHeaders, md5: bytes | None, base: DeltaBase | None
                         ) -> PutResult:
    """One commit of `blocks` in order, with the whole MD5 and the CRC64 composed from the blocks' (when every
    block's is known); conditional on the version a delta named, where it names parts of it."""
    tokens = [writer.token(i) for i in range(len(blocks))]
    from_base = [b for b in blocks if b[1] != tokens[b[0]]]
    crc = crc64_metadata([(int(b[4], 16) if b[4] else None, lengths[tokens[b[0]]]) for b in blocks], md5)
    headers = replace(headers, content_md5=md5, metadata={**headers.metadata, **crc})
    sizes = {**lengths, **{b[1]: lengths[tokens[b[0]]] for b in from_base}}
    conditions = Conditions(if_match=base.etag) if from_base and base is not None else NO_CONDITIONS
    return await commit_checked(ctx, writer, blob, [(b[1], b[2]) for b in blocks], sizes, headers, conditions)


def _reported(staged: tuple[ShardReport, ...], count: int) -> list[Block]:
    """Every block of the file as its range task reported it, in order; none if any range reported none."""
    blocks = sorted((b for r in staged for b in r.blocks), key=lambda b: b[0])
    return blocks if [b[0] for b in blocks] == list(range(count)) else []


async def _commit_all(ctx: EngineContext, spec: RangeSpec, headers: BlobHeaders) -> str:
    """Every part of the file in order (a task run again finds its own commit); the job stages them again when
    they are gone and no commit of ours landed."""
    writer = ctx.store.writer(spec.file.blob, spec.file.nonce)
    tokens, expected = part_layout(writer, spec.file.size, spec.block_size)
    return (await commit_checked(ctx, writer, spec.file.blob, [(t, False) for t in tokens], expected, headers)).etag


async def fetch_range(spec: RangeSpec, publish: Publish | None, worker: str) -> ShardReport:
    """Fetch blocks [first, last) of a blob (If-Match the planned version) into the shared partial file, but those an
    earlier run left there (`spec.done`), each block's CRC64 taken as it lands where the blob's check is one (the
    finish composes them: no second pass) and each reported to the client as written (its journal is what a rerun
    after a kill resumes from)."""
    f, size = spec.file, spec.block_size

    async def fetch(ctx: EngineContext, _source: Store | None, relay: Relay) -> Staged:
        part = await _shared_part(ctx, spec)
        ranges = [(i, i * size, min(size, f.size - i * size)) for i in range(spec.first, spec.last)]
        crc64 = whole_check(ctx.config.check_md5, f.blob, f.listed()) == "crc64"
        reads = RangeFetch(ctx, f.rel, f.blob, f.etag or None, ranges, _ReportedSink(ctx, part, relay, f.rel), None,
                           crc64=crc64)
        try:
            sent = await reads.run(set(spec.done))
            await in_thread(ctx.io_pool, part.sync)
        finally:
            part.close()
        crcs = reads.crcs or {}
        # Every block fetched (its CRC64 where taken): the client knows them all in, whatever its events said.
        return sum(length for i, _, length in ranges if i not in spec.done), sent, [
            (i, "", False, "", f"{crcs[i][0]:016x}" if i in crcs else "") for i, _, _ in ranges if i not in spec.done]

    return await _range_task(spec, publish, worker, fetch)


class _ReportedSink(FileSink):
    """The shared partial file as a range task writes it: each range, once written, reported to the client."""

    def __init__(self, ctx: EngineContext, part: PartFile, relay: Relay, rel: str) -> None:
        super().__init__(ctx, part, None)
        self.relay, self.rel = relay, rel

    async def landed(self, idx: int, offset: int, view: memoryview) -> None:
        await super().landed(idx, offset, view)
        self.relay.landed(self.rel, idx, len(view), self.boot)


async def finish_download(spec: RangeSpec, md5_hex: str, *fetched: ShardReport, publish: Publish | None,
                          worker: str) -> ShardReport:
    """Check the whole partial file against the blob's stored check (digest.whole_check), then give it its name:
    one rename, once whole. `md5_hex`: the file's MD5 as the client took it while the ranges landed (else, where
    the MD5 is the check, it is read back here)."""
    f = spec.file

    async def finish(ctx: EngineContext, _source: Store | None, outcome: FileOutcome) -> None:
        props, mode = f.listed(), ctx.config.check_md5
        part = await _shared_part(ctx, spec)

        async def md5_again() -> bytes:
            whole = new_md5()
            await in_thread(ctx.io_pool, feed, whole, part.chunks(0, f.size))
            return whole.digest()

        try:
            kind = whole_check(mode, f.blob, props)
            digest = None
            if kind == "md5":
                digest = Digest("md5", bytes.fromhex(md5_hex) if md5_hex else await md5_again())
            elif kind == "crc64":
                digest = await _fetched_crc64(ctx, part, spec, fetched)
            digest = await verify_read(mode, f.blob, props, digest, md5_again, WRITTEN_NOWHERE)
            mtime = destination_mtime_ns(props) if ctx.config.preserve_last_modified_time else None
            await in_thread(ctx.io_pool, part.finish, mtime)
            md5 = digest.value if digest is not None and digest.kind == "md5" else props.content_md5
            outcome.etag, outcome.md5 = f.etag or "", (md5 or b"").hex()
        except BlobsyncError:
            part.discard()
            raise
        finally:
            part.close()

    return await _file_task(spec, "finish", fetched, publish, worker, finish)


async def _fetched_crc64(ctx: EngineContext, part: PartFile, spec: RangeSpec, fetched: tuple[ShardReport, ...]
                         ) -> Digest:
    """The whole file's CRC64 from its blocks' as the range tasks took them, or read back where one is missing."""
    size, total = spec.block_size, spec.file.size
    crcs = {b[0]: int(b[4], 16) for r in fetched for b in r.blocks if b[4]}
    count = block_count(total, size)
    if len(crcs) == count and set(crcs) == set(range(count)):
        return crc64_digest([(crcs[i], min(size, total - i * size)) for i in range(count)])

    def read_back() -> Digest:
        crc = 0
        for chunk in part.chunks(0, total):
            crc = crc64_int(chunk, crc)
        return Digest("crc64", struct.pack("<Q", crc))

    return await in_thread(ctx.io_pool, read_back)


async def _shared_part(ctx: EngineContext, spec: RangeSpec) -> PartFile:
    """The split download's one partial file, which every range task writes its ranges into."""
    target = safe_join(Path(spec.job.local_root), spec.file.rel)
    base = Path(spec.job.base or spec.job.local_root)  # no link below the folder the user named
    return await in_thread(ctx.io_pool, lambda: shared_part(target, spec.file.size, base, keep=True))


# --- blob-to-blob copies: the destination's service reads each range from the source's URL ---


async def stage_from_url(ctx: EngineContext, spec: RangeSpec, source: Store, present: set[str]) -> int:
    """Stage blocks [first, last) of the copy as the engine's service copy stages parts (engine/s2s.ServiceParts):
    ranges the destination's service reads from the source at the version listed, leaving those the store holds
    already; the bytes staged."""
    f, size = spec.file, spec.block_size
    writer = ctx.store.writer(f.blob, f.nonce)
    # Parts another writer left were cleared by the client before the ranges began: a refusal now fails the copy.
    parts = ServiceParts(ctx, _task_row(ctx, spec, JobKind.COPY), writer,
                         await source.copy_source(f.source, f.etag or None, ctx.store.location),
                         BlobHeaders("application/octet-stream", None, {}), NO_CONDITIONS, clear=False)
    window = [(i, i * size, min(size, f.size - i * size)) for i in range(spec.first, spec.last)]
    todo = [r for r in window if writer.token(r[0]) not in present]
    ctx.progress.advanced(f.rel, sum(r[2] for r in window) - sum(r[2] for r in todo), 0)
    await parts.stage(todo)
    return parts.sent


async def commit_copy(ctx: EngineContext, spec: RangeSpec, source: Store) -> str:
    """Commit every part of the copy in order with the source's properties, then verify what the store holds."""
    f = spec.file
    props = await ctx.request(lambda: source.stat(f.source))
    # A listing gives ETags bare, a HEAD quoted (as HTTP has them): the same version either way.
    if props is None or props.etag.strip('"') != (f.etag or "").strip('"'):
        raise BlobNotFoundError(f"{f.source}: the source blob is gone or changed since it was listed; run again",
                                status=404, code="BlobNotFound")
    tags = await source_tags(ctx.config, source, ctx, f.source)
    return await _commit_all(ctx, spec, replace(copy_headers(ctx.config, props, ctx.store.capabilities), tags=tags))
