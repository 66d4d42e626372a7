"""cp's one pipeline, whichever way the bytes go: list the source (one file or blob, or a folder or prefix with its
filters), journal each file with the name it gets, and hand the FileOps not done yet to the runner (this process,
or a cluster). What differs per direction (upload, download, blob to blob) is a small Direction."""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from blobsync.backends.base import BlobProperties, Location, Store
from blobsync.engine.context import EngineContext
from blobsync.engine.digest import stored_crc64
from blobsync.engine.enumerate import index_in_thread
from blobsync.engine.listing import RemoteLister, one_blob
from blobsync.engine.mtime import MTIME_KEY, destination_mtime_ns
from blobsync.errors import BlobNotFoundError, ExitCode, UnsafeNameError, UsageError
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, RemoteRunner, WorkItem, batches
from blobsync.jobs.spec import CopySpec, DownloadSpec, UploadSpec
from blobsync.journal import FileRow, FileState, JobKind, JobRow
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.files import SkippedEntry, blob_rel, check_source, stat_file, walk, warm_if_cold
from blobsync.local.folding import NameClaims, probe
from blobsync.local.target import open_folder, safe_join
from blobsync.naming import folder_prefix, upload_name
from blobsync.report import DRY_RUN, Action, FileResult, FileStatus, Report

log = logging.getLogger("blobsync")
CpSpec = UploadSpec | DownloadSpec | CopySpec


@dataclass
class Listing:
    """What a cp's source holds: index entries under `root` (the folder the operations' local paths are under),
    one (`single`: a file or blob named) or a whole listing in the scratch index."""

    root: Path
    single: Entry | None = None
    index: SyncIndex | None = None
    skipped: list[SkippedEntry] = field(default_factory=list)  # files the walk could not take (uploads)

    def batches(self) -> Iterator[list[Entry]]:
        if self.single is not None:
            yield [self.single]
        else:
            assert self.index is not None
            yield from batches(self.index.entries("src"))

    def totals(self) -> tuple[int, int] | None:
        return None if self.index is None else self.index.totals("src")


def _entry(rel: str, props: BlobProperties) -> Entry:
    return Entry(rel, props.size, destination_mtime_ns(props), MTIME_KEY in props.metadata, props.content_md5,
                 props.etag or None, props.name, tier=props.tier, crc64=stored_crc64(props.metadata, props.content_md5))


class Direction:
    """What one way of copying adds to the pipeline (the base: a blob store's side, read by name or prefix)."""

    job_kind: JobKind
    op: OpKind
    verb: str
    done_reason: str

    def __init__(self, job: TransferJob) -> None:
        self.job, self.spec, self.ctx = job, job.spec, job.ctx

    def sides(self) -> tuple[str, str]:
        return str(self.spec.source), str(self.spec.dest)

    async def listing(self) -> Listing:
        raise NotImplementedError

    def blob(self, e: Entry, single: bool) -> str:
        """The name of the blob the file `e` is (or becomes): the journal's blob column."""
        return e.name or e.rel

    def done(self, row: FileRow, e: Entry, root: Path) -> bool:
        """Whether this job transferred the file already (a resumed run leaves it)."""
        return row.state is FileState.COMMITTED and (row.size, row.mtime_ns) == (e.size, e.mtime_ns)

    def operation(self, row: FileRow, e: Entry, single: bool) -> FileOp:
        return FileOp.of_entry(self.op, e, row.blob)

    def target(self, root: Path, e: Entry, name: str) -> str:
        """Where a dry run says the file would go."""
        return name

    async def _listed(self, store: Store) -> SyncIndex:
        """Every blob under the source prefix into the scratch index."""
        index = self.job.index()
        source: Location = self.spec.source  # type: ignore[assignment]
        prefix = folder_prefix(source.path)
        filters = self.spec.filters
        lister = RemoteLister(store, self.job.runner.requests, prefix, index, "src", filters,
                              lambda props, entry: props.last_modified.timestamp())
        await lister.listing()
        if not lister.listed and prefix and filters.top is None and self.job.runner.job is None:
            # A folder URL with nothing under it is most likely a typo; AzCopy fails too. (A wildcard that
            # matches nothing, or filters that take nothing, are a successful empty copy.)
            raise BlobNotFoundError(f"no blobs under {prefix!r} in container {source.container!r}", status=404,
                                    code="BlobNotFound", hint="check the URL (names are case-sensitive)")
        return index


class Upload(Direction):
    job_kind, op, verb, done_reason = JobKind.UPLOAD, OpKind.UPLOAD, "upload", "already uploaded by this job"
    spec: UploadSpec

    def sides(self) -> tuple[str, str]:
        return str(self.spec.source), self.spec.dest.display

    async def listing(self) -> Listing:
        source = self.spec.source
        check_source(source, self.ctx.config.recursive)
        if not source.is_dir():
            identity = stat_file(source)
            return Listing(source.parent, single=Entry(source.name, identity.size, identity.mtime_ns,
                                                       inode=identity.inode))
        # Walked into the scratch index first (in a worker thread): the totals are known before the first byte
        # moves, and however many files there are, only a batch of them is in memory at once.
        index = self.job.index()
        listing = Listing(source, index=index)
        await index_in_thread(index, "src", lambda: self._walk(listing.skipped))
        return listing

    def _walk(self, skipped: list[SkippedEntry]) -> Iterator[Entry]:
        """The folder's files the filters take (skipped ones set aside); folders nothing could match in are not
        even listed."""
        filters = self.spec.filters
        for item in walk(self.spec.source, follow_symlinks=self.ctx.config.follow_symlinks, enters=filters.enters):
            if isinstance(item, SkippedEntry):
                if filters.matches(item.rel):
                    skipped.append(item)
            elif filters.matches(item.rel, item.identity.mtime_ns / 1e9):
                yield Entry(item.rel, item.identity.size, item.identity.mtime_ns, inode=item.identity.inode)

    def blob(self, e: Entry, single: bool) -> str:
        return upload_name(self.spec.dest.path, blob_rel(e.rel), single=single)

    def done(self, row: FileRow, e: Entry, root: Path) -> bool:
        return row.state is FileState.COMMITTED and (row.size, row.mtime_ns, row.inode) == (e.size, e.mtime_ns,
                                                                                              e.inode)

    def operation(self, row: FileRow, e: Entry, single: bool) -> FileOp:
        # A file of a walked folder is opened only as the walk listed it (its inode).
        return FileOp(OpKind.UPLOAD, e.rel, row.blob, e.size, e.mtime_ns, inode=0 if single else e.inode)


class Download(Direction):
    job_kind, op, verb, done_reason = JobKind.DOWNLOAD, OpKind.DOWNLOAD, "download", "already downloaded by this job"
    spec: DownloadSpec

    def sides(self) -> tuple[str, str]:
        return self.spec.source.display, str(self.spec.dest)

    async def listing(self) -> Listing:
        spec = self.spec
        if not self.ctx.config.recursive:
            name = spec.source.path
            if not name or name.endswith("/"):
                raise UsageError(f"{spec.source.display!r} names no blob: add the blob's name, or pass -r to "
                                 "download everything under a prefix")
            props = await one_blob(self.ctx.store, self.job.runner.requests, name, "download")
            if spec.dest.is_dir() or spec.dest_is_folder:
                return Listing(spec.dest, single=_entry(posixpath.basename(name), props))
            return Listing(spec.dest.parent, single=_entry(spec.dest.name, props))
        if spec.base is not None and not spec.dry_run:  # the folder cp -r adds: made here, never through a link
            made = open_folder(spec.base, spec.dest.relative_to(spec.base).parts)
            if made is not None:
                os.close(made)
        if spec.dest.exists() and not spec.dest.is_dir():
            raise UsageError(f"destination {str(spec.dest)!r} is a file: -r needs a folder")
        return Listing(spec.dest, index=await self._listed(self.ctx.store))

    def done(self, row: FileRow, e: Entry, root: Path) -> bool:
        if row.state is not FileState.COMMITTED or row.etag != e.etag:
            return False
        target = root / e.rel
        return target.is_file() and target.stat().st_size == e.size

    def target(self, root: Path, e: Entry, name: str) -> str:
        return str(safe_join(root, e.rel))


class BlobToBlob(Direction):
    job_kind, op, verb, done_reason = JobKind.COPY, OpKind.COPY, "copy", "already copied by this job"
    spec: CopySpec

    def sides(self) -> tuple[str, str]:
        return self.spec.source.display, self.spec.dest.display

    async def listing(self) -> Listing:
        assert self.job.source is not None
        if not self.spec.many:
            props = await one_blob(self.job.source, self.job.runner.requests, self.spec.source.path, "copy")
            return Listing(Path(), single=_entry(posixpath.basename(props.name), props))
        return Listing(Path(), index=await self._listed(self.job.source))

    def blob(self, e: Entry, single: bool) -> str:
        return self.spec.dest.path if not self.spec.many else folder_prefix(self.spec.dest.path) + e.rel


DIRECTIONS: dict[type, type[Direction]] = {UploadSpec: Upload, DownloadSpec: Download, CopySpec: BlobToBlob}


class TransferJob:
    """One run of a cp job (new or resumed): `await run()`. `source` is a blob-to-blob copy's source store."""

    def __init__(self, spec: CpSpec, ctx: EngineContext, source: Store | None = None, *, job: JobRow | None = None,
                 on_action: Callable[[Action], None] | None = None, cluster: RemoteRunner | None = None) -> None:
        self.spec, self.ctx, self.source = spec, ctx, source
        self.on_action = on_action or (lambda action: None)
        self._index: SyncIndex | None = None
        self.way = DIRECTIONS[type(spec)](self)
        self.runner = JobRunner(self.way.job_kind, ctx, job, extra_options={"filters": spec.filters.text or None},
                                cluster=cluster)

    def index(self) -> SyncIndex:
        """The scratch index a listing goes into (made when a folder or prefix is listed: a file named needs none)."""
        if self._index is None:
            self._index = SyncIndex(self.runner.journal.path.parent)
        return self._index

    async def run(self) -> Report:
        try:
            listing = await self.way.listing()
            if self.spec.dry_run:
                return self._dry_run(listing)
            return await self._run(listing)
        finally:
            if self._index is not None:
                self._index.close()

    def _report(self, job_id: str) -> Report:
        source, dest = self.way.sides()
        return Report(job_id, source, dest, kind=self.way.verb, listener=self.runner.progress.finished)

    async def _run(self, listing: Listing) -> Report:
        runner, way = self.runner, self.way
        report = self._report(runner.open_job(*way.sides()).id)
        for item in listing.skipped:
            runner.settle(report, None, FileResult(item.rel, "", 0, FileStatus.FAILED if item.failed else
                                                   FileStatus.SKIPPED, reason=item.reason,
                                                   exit_code=ExitCode.PARTIAL if item.failed else ExitCode.OK))
        runner.settle_missing(report, self.spec.filters)
        if way.op is not OpKind.DOWNLOAD and self.ctx.config.create_container and await runner.requests(
                self.ctx.store.create_container):
            log.info("created container %s", self.ctx.store.display_url)
        base = self.spec.base if isinstance(self.spec, DownloadSpec) else None
        perform = runner.performing(listing.root, self.source, base)
        await runner.run(report, self._work(listing, report), listing.totals())
        if perform.copier is not None and perform.copier.fallback is not None:
            report.notes.append(f"copied through this machine: {perform.copier.fallback}")
        return report

    def _dry_run(self, listing: Listing) -> Report:
        """--dry-run: each file that would move, and where to; nothing is sent, written or journaled."""
        report = self._report(DRY_RUN)
        self.runner.settle_missing(report, self.spec.filters)
        verb, single = self.way.verb, listing.single is not None
        for e in (e for batch in listing.batches() for e in batch):
            name = self.way.blob(e, single)
            try:
                target = self.way.target(listing.root, e, name)
            except UnsafeNameError as exc:
                self.runner.settle(report, None, FileResult(e.rel, name, e.size, FileStatus.FAILED, reason=str(exc),
                                                            exit_code=ExitCode.PARTIAL))
                continue
            self.on_action(Action(verb, e.rel, f"to {target}", e.size))
            self.runner.settle(report, None, FileResult(e.rel, name, e.size, FileStatus.PLANNED,
                                                        reason=f"would {verb} to {target}"))
        return report

    def _work(self, listing: Listing, report: Report) -> Iterator[WorkItem]:
        """Journal rows for each batch (a resumed job's own included), and the operations not done yet."""
        way, single = self.way, listing.single is not None
        assert self.runner.job is not None
        claims = NameClaims(probe(listing.root)) if way.op is OpKind.DOWNLOAD else None
        for batch in listing.batches():
            if way.op is OpKind.UPLOAD:
                warm_if_cold([(listing.root / e.rel, e.size) for e in batch], self.ctx.io_pool.submit)
            rows = self.runner.journal.add_files(self.runner.job.id, (
                (e.rel, way.blob(e, single), e.size, e.mtime_ns, e.inode) for e in batch))
            for e in batch:
                row = rows[e.rel]
                if claims is not None and not self.runner.claimed(report, row, e, listing.root, claims):
                    continue
                if way.done(row, e, listing.root):
                    self.runner.settle(report, None, FileResult(e.rel, row.blob, e.size, FileStatus.SKIPPED,
                                                                reason=way.done_reason))
                    continue
                yield WorkItem(row, way.operation(row, e, single))
