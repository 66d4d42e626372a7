"""A sync run: enumerate both sides into the index, decide, transfer through the engine, then delete safely."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from blobsync.backends.base import Store
from blobsync.engine.context import EngineContext
from blobsync.engine.delete import Doomed
from blobsync.engine.digest import md5_of_file
from blobsync.engine.enumerate import index_in_thread
from blobsync.engine.listing import FANOUT_MAX, RemoteLister, entry_time
from blobsync.engine.name_ranges import RANGES_MAX
from blobsync.errors import BlobsyncError, ExitCode, UsageError
from blobsync.jobs.compare import MTIME_WINDOWS, CompareMode, decide
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, RemoteRunner, WorkItem, batches
from blobsync.jobs.spec import SyncSpec
from blobsync.journal import FileRow, JobKind
from blobsync.journal.index import Entry, SyncIndex
from blobsync.local.child import ChildUnavailable
from blobsync.local.files import SkippedEntry, warm_if_cold
from blobsync.local.folding import Folding, NameClaims, probe
from blobsync.local.walker import in_process, index_in_process, tree_entries
from blobsync.naming import folder_prefix
from blobsync.options import DeleteMode as DeleteMode
from blobsync.report import DRY_RUN, NO_JOB, Action, FileResult, FileStatus, Report

log = logging.getLogger("blobsync")


class SyncJob:
    """One sync run. `on_action` sees every decision (dry runs print them); `confirm` answers --delete prompt."""

    def __init__(self, spec: SyncSpec, ctx: EngineContext, *,
                 on_action: Callable[[Action], None] | None = None,
                 confirm: Callable[[int], bool] | None = None, cluster: RemoteRunner | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.store = ctx.store
        self.journal = ctx.journal
        self.config = ctx.config
        self.runner = JobRunner(self.job_kind(spec), ctx, cluster=cluster)
        self.on_action = on_action or (lambda action: None)
        self.confirm = confirm
        self.complete = True  # both sides enumerated without error
        self.local_count: int | None = None  # entries of the local side, once its walk is complete
        self.held = 0  # source files not ready this run (spec.ready)
        self.problems: list[FileResult] = []

    @staticmethod
    def job_kind(spec: SyncSpec) -> JobKind:
        return JobKind.SYNC_UP if spec.upload else JobKind.SYNC_DOWN

    @property
    def kind(self) -> str:
        """The report's kind."""
        return "upload" if self.spec.upload else "download"

    @property
    def _prefix(self) -> str:
        return folder_prefix(self.spec.remote.path)

    @property
    def local(self) -> Path:
        assert self.spec.local is not None, "a blob-to-blob sync has no local side"
        return self.spec.local

    def _sides(self) -> tuple[str, str]:
        """The source and the destination, as the report and the journal show them."""
        spec = self.spec
        return (str(self.local), spec.remote.display) if spec.upload else (spec.remote.display, str(self.local))

    # --- enumeration ----------------------------------------------------------------------------------

    def _check_local(self) -> bool:
        """Whether the local side is there to walk (a missing target of a sync down is an empty side)."""
        if not self.local.exists():
            if self.spec.upload:
                raise UsageError(f"source folder {str(self.local)!r} does not exist")
            return False
        if not self.local.is_dir():
            raise UsageError(f"{str(self.local)!r} is not a folder: sync works on folders (use cp for one file)")
        return True

    def _local_entries(self) -> Iterator[Entry]:
        return tree_entries(self.local, self.spec.filters, follow_symlinks=self.config.follow_symlinks,
                            upload=self.spec.upload, skipped=self._skipped)

    def _skipped(self, item: SkippedEntry) -> None:
        if item.failed:
            self.complete = False  # an unreadable folder: its files may exist; never delete for them
        self.problems.append(FileResult(item.rel, "", 0, FileStatus.FAILED if item.failed else FileStatus.SKIPPED,
                                        reason=item.reason,
                                        exit_code=ExitCode.PARTIAL if item.failed else ExitCode.OK))

    async def _index_local(self, index: SyncIndex, side: str) -> None:
        """Walk the local tree while the listing waits on the service: in a worker thread, or for a large tree in
        a process of its own (the walk and the listing's parsing then run on two cores)."""
        seen = functools.partial(self.runner.progress.listed, side)
        if not self._check_local():
            pass  # an empty side
        elif in_process(self.local):
            try:
                skipped = await index_in_process(index, side, self.local, self.spec.filters,
                                                 follow_symlinks=self.config.follow_symlinks, upload=self.spec.upload,
                                                 seen=seen)
            except ChildUnavailable:  # a host where no process starts: walked here, as without one
                await index_in_thread(index, side, self._local_entries, seen)
            else:
                for item in skipped:
                    self._skipped(item)
        else:
            await index_in_thread(index, side, self._local_entries, seen)
        self.local_count = index.count(side)

    async def _index_remote(self, index: SyncIndex, side: str) -> None:
        """List the remote side into the index, fanned out by folder unless the local root (whose layout the
        remote side, a sync's other half, most likely shares) is flat or has more folders than fanning out pays
        for: then one listing, its last page sized by the local count."""
        lister = self._lister(self.store, self._prefix, index, side)
        if self.store.capabilities.lists_levels and self._folders():
            await lister.fan_out()
        else:
            await lister.under(self._prefix, lambda: self.local_count, ranges=RANGES_MAX)

    def _lister(self, store: Store, prefix: str, index: SyncIndex, side: str) -> RemoteLister:
        return RemoteLister(store, self.runner.requests, prefix, index, side, self.spec.filters, entry_time,
                            lambda count: self.runner.progress.listed(side, count))

    def _folders(self) -> bool:
        """Whether the remote side is worth fanning out: the local root holds folders, but not more than a level
        fans out to (a request per folder would then cost more than pages of 5,000), or it says nothing (it is
        empty, or not there yet: a first sync down)."""
        if self.spec.local is None:
            return True
        files = folders = 0
        try:
            with os.scandir(self.spec.local) as entries:
                for e in entries:
                    if e.is_dir(follow_symlinks=False):
                        folders += 1
                    else:
                        files += 1
        except OSError:
            return True
        return folders <= FANOUT_MAX and (folders > 0 or files == 0)

    # --- the run --------------------------------------------------------------------------------------------

    async def run(self) -> Report:
        index = SyncIndex(self.journal.path.parent)
        try:
            return await self._run(index)
        finally:
            index.close()

    async def _run(self, index: SyncIndex) -> Report:
        spec = self.spec
        if spec.upload and self.config.create_container and not spec.dry_run:
            await self.runner.requests(self.store.create_container)
        await self._enumerate(index)
        source, dest = self._sides()
        report = Report(NO_JOB, source, dest, kind=self.kind, listener=self.runner.progress.finished)
        for problem in self.problems:
            self.runner.settle(report, None, problem)
        todo = await self._decisions(index)
        report.files_in_sync = index.count("src") - todo - self.held
        report.files_held = self.held
        if spec.dry_run:
            return await self._dry_run(index, report)
        orphans = spec.delete is not DeleteMode.FALSE and next(index.orphans(), None) is not None
        if not todo and not orphans:
            return report  # a no-op sync opens no job and writes nothing to the journal
        report.job_id = self.runner.open_job(source, dest).id
        self._performing()
        await self.runner.run(report, self._work(index, report), index.todo_totals())
        await self._deletes(index, report, dry_run=False)
        return report

    async def _enumerate(self, index: SyncIndex) -> None:
        """Both sides into the index: the local walk runs in a thread while the listing waits on the service."""
        self.runner.progress.listing = True
        try:
            await self._both(index)
        finally:
            self.runner.progress.listing = False

    async def _both(self, index: SyncIndex) -> None:
        local_side, remote_side = ("src", "dst") if self.spec.upload else ("dst", "src")
        local = asyncio.create_task(self._index_local(index, local_side))
        try:
            await self._index_remote(index, remote_side)
        finally:
            if not local.done():
                await asyncio.wait([local])
        local.result()

    async def _dry_run(self, index: SyncIndex, report: Report) -> Report:
        verb = self.kind
        report.job_id = DRY_RUN
        for entry, reason in index.todo():
            self.on_action(Action(verb, entry.rel, reason, entry.size))
            self.runner.settle(report, None, FileResult(entry.rel, entry.name or entry.rel, entry.size,
                                                        FileStatus.PLANNED, reason=f"would {verb}: {reason}"))
        await self._deletes(index, report, dry_run=True)
        return report

    async def _decisions(self, index: SyncIndex) -> int:
        """Compare every source entry with its destination; mark the ones to transfer. Returns how many."""
        mode = self.spec.compare
        ready = self.spec.ready if self.spec.upload else None
        marked = 0
        batch: list[tuple[str, str]] = []
        # Pairs decide() would skip are left out by SQLite: a no-op sync of many files builds no Entry. Not with
        # `ready`, which must see every source file (held files are counted).
        if ready is None and mode is CompareMode.SIZE_ONLY:
            pairs = index.pairs(skip_same_size=True)
        elif ready is None and mode is CompareMode.SIZE_AND_MTIME:
            pairs = index.pairs(skip_same_size=True, newer_than=MTIME_WINDOWS)
        else:
            pairs = index.pairs()
        for src, dst in pairs:
            if ready is not None and not ready(src.rel, src.mtime_ns):
                self.held += 1
                continue
            src_md5 = None
            if mode is CompareMode.MD5 and dst is not None and src.size == dst.size:
                dst, src_md5 = await self._md5s(src, dst)
            decision = decide(src, dst, mode, src_md5)
            if decision.transfer:
                batch.append((src.rel, decision.reason))
                if len(batch) >= 5000:
                    marked += index.mark(batch)
                    batch = []
        return marked + index.mark(batch)

    async def _md5s(self, src: Entry, dst: Entry) -> tuple[Entry, bytes | None]:
        """For --compare-hash MD5: the destination entry with its MD5 and the source's MD5 (a local file's from
        the journal's cache, or hashed now)."""
        if self.spec.upload:
            return dst, await self._local_md5(src)
        # The local file is the destination: its MD5 stands in for the missing stored one.
        return dst._replace(md5=await self._local_md5(dst)), src.md5

    def _local_path(self, entry: Entry) -> Path:
        """Where a local entry's file is (its name differs from `rel` when the service spells it otherwise)."""
        return self.local / (entry.name or entry.rel)

    async def _local_md5(self, entry: Entry) -> bytes | None:
        path = self._local_path(entry)
        cached = self.journal.cached_md5(str(path), entry.size, entry.mtime_ns, entry.inode)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        try:
            digest = await loop.run_in_executor(self.ctx.io_pool, md5_of_file, path)
        except OSError as exc:
            log.warning("%s: cannot hash: %s", entry.rel, exc.strerror or exc)
            return None
        self.journal.cache_md5(str(path), entry.size, entry.mtime_ns, entry.inode, digest)
        return digest

    def _performing(self) -> None:
        self.runner.performing(self.local)

    def _work(self, index: SyncIndex, report: Report) -> Iterator[WorkItem]:
        """The transfers, built batch by batch as the workers take them: memory stays flat however many."""
        spec = self.spec
        assert self.runner.job is not None
        job_id = self.runner.job.id
        prefix = self._prefix
        claims = NameClaims(probe(self.local) if not spec.upload else Folding())
        if claims.folding.active:  # every blob of the listing holds its name, transferred this run or not
            claims.claim_all(e.rel for e in index.entries("src"))
        for batch in batches(index.todo()):
            if spec.upload:
                warm_if_cold([(self._local_path(e), e.size) for e, _ in batch], self.ctx.io_pool.submit)
            rows = self.journal.add_files(job_id, (
                (e.rel, prefix + e.rel if spec.upload else e.name or e.rel, e.size, e.mtime_ns, e.inode)
                for e, _ in batch))
            for entry, reason in batch:
                row = rows[entry.rel]
                if spec.upload:
                    self.on_action(Action("upload", entry.rel, reason, entry.size))
                    yield WorkItem(row, FileOp(OpKind.UPLOAD, entry.name or entry.rel, row.blob, entry.size,
                                               entry.mtime_ns, inode=entry.inode))
                elif self.runner.claimed(report, row, entry, self.local, claims):
                    self.on_action(Action("download", entry.rel, reason, entry.size))
                    yield WorkItem(row, FileOp.of_entry(OpKind.DOWNLOAD, entry))

    # --- deletes ------------------------------------------------------------------------------------------

    async def _deletes(self, index: SyncIndex, report: Report, *, dry_run: bool) -> None:
        spec = self.spec
        if spec.delete is DeleteMode.FALSE:
            return
        count = index.count_orphans()  # only paths the filters admitted were indexed
        if not count:
            return
        refuse = self._refusal(index, report, count)
        if refuse:
            report.deletes_refused = f"deleted nothing: {refuse} ({count} candidates)"
            log.warning("%s", report.deletes_refused)
            return
        if dry_run:
            for entry in index.orphans():
                self.on_action(Action("delete", entry.rel, "not in source", entry.size))
            return
        if spec.delete is DeleteMode.PROMPT and (self.confirm is None or not self.confirm(count)):
            report.deletes_refused = f"deleted nothing: not confirmed ({count} candidates)"
            return
        if spec.upload:
            await self._delete_blobs(index, report)
        else:
            self._delete_files(index, report)
        self.journal.flush()
        self.runner.tally(report)

    def _refusal(self, index: SyncIndex, report: Report, count: int) -> str | None:
        """Why no delete may run, if one may not."""
        if not self.complete:
            return "the source could not be enumerated completely (see the failures above)"
        if report.files_failed:
            return "some transfers failed"
        if index.count("src") == 0:
            return "the source is empty; refusing to delete everything at the destination"
        limit = self.spec.max_delete
        total = index.count("dst")
        if limit is not None and limit.count is not None and count > limit.count:
            return f"{count} deletions exceed --max-delete {limit.count}"
        if limit is not None and limit.percent is not None and count > total * limit.percent / 100:
            return f"{count} of {total} would be deleted, over --max-delete {limit.text}"
        return None

    def _doomed(self, index: SyncIndex) -> Iterator[Doomed]:
        """The orphans with their journal rows, journaled a batch at a time as the deleter takes them."""
        assert self.runner.job is not None
        job_id = self.runner.job.id
        for batch in batches(index.orphans()):
            rows = self.journal.add_files(job_id, (
                (f"delete:{e.rel}", e.name or self._prefix + e.rel, e.size, e.mtime_ns, e.inode) for e in batch))
            for e in batch:
                row = rows[f"delete:{e.rel}"]
                yield Doomed(e.rel, row.blob, e.size, e.etag, row)

    async def _delete_blobs(self, index: SyncIndex, report: Report) -> None:
        from blobsync.engine.delete import BlobDeleter, Outcome

        def done(item: Doomed, outcome: Outcome, error: BlobsyncError | None) -> None:
            row = item.key
            assert isinstance(row, FileRow)
            if outcome is Outcome.FAILED:
                self.runner.settle(report, row, FileResult(
                    item.rel, item.name, item.size, FileStatus.FAILED, reason=str(error),
                    exit_code=error.exit_code if error else ExitCode.PARTIAL))
                return
            self.journal.forget_commit(self.store.container_url, item.name)
            self.runner.settle(report, row, FileResult(item.rel, item.name, item.size, FileStatus.DELETED))

        def announced(items: Iterator[Doomed]) -> Iterator[Doomed]:
            for item in items:
                self.on_action(Action("delete", item.rel, "not in source", item.size))
                yield item

        deleter = BlobDeleter(self.store, self.runner.requests, self.config.max_concurrency, done,
                              batch=self.spec.batch_deletes)
        await deleter.run(announced(self._doomed(index)))

    def _delete_files(self, index: SyncIndex, report: Report) -> None:
        from blobsync.local.target import remove_below

        for item in self._doomed(index):
            self.on_action(Action("delete", item.rel, "not in source", item.size))
            row = item.key
            assert isinstance(row, FileRow)
            try:
                remove_below(self.local, item.rel)  # no link below the target is followed, a folder's included
            except (OSError, BlobsyncError) as exc:
                message = str(exc) if isinstance(exc, BlobsyncError) else f"cannot delete: {exc.strerror or exc}"
                self.runner.settle(report, row, FileResult(item.rel, item.name, item.size, FileStatus.FAILED,
                                                           reason=message, exit_code=ExitCode.PARTIAL))
                continue
            self.runner.settle(report, row, FileResult(item.rel, item.name, item.size, FileStatus.DELETED))


__all__ = ["SyncJob"]
