"""A download job: list the blobs (or one blob), merge with the journal, download under the budgets."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

from blobsync.backends.base import BlobProperties
from blobsync.engine.context import EngineContext
from blobsync.engine.listing import RemoteLister, one_blob
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.errors import BlobNotFoundError, ExitCode, UnsafeNameError, UsageError
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, RemoteRunner, WorkItem, listed_batches
from blobsync.jobs.spec import DownloadSpec
from blobsync.journal import FileState, JobKind, JobRow
from blobsync.journal.index import SyncIndex
from blobsync.local.folding import NameClaims, probe
from blobsync.local.target import safe_join
from blobsync.naming import folder_prefix
from blobsync.report import DRY_RUN, Action, FileResult, FileStatus, Report


class DownloadJob:
    """One run of a download job (new or resumed). Construct with its side effects; then `await run()`."""

    def __init__(self, spec: DownloadSpec, ctx: EngineContext, *, job: JobRow | None = None,
                 on_action: Callable[[Action], None] | None = None, cluster: RemoteRunner | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.store = ctx.store
        self.on_action = on_action or (lambda action: None)
        self.runner = JobRunner(JobKind.DOWNLOAD, ctx, job, extra_options={"filters": spec.filters.text or None},
                                cluster=cluster)

    async def _one_blob(self) -> tuple[Path, str, BlobProperties]:
        """The local folder, the local name and the blob of a download of one blob."""
        spec = self.spec
        name = spec.source.path
        if not name or name.endswith("/"):
            raise UsageError(f"{spec.source.display!r} names no blob: add the blob's name, or pass -r to download "
                             "everything under a prefix")
        props = await one_blob(self.store, self.runner.requests, name, "download")
        base = posixpath.basename(name)
        if spec.dest.is_dir() or spec.dest_is_folder:
            return spec.dest, base, props
        return spec.dest.parent, spec.dest.name, props

    async def _list_into(self, index: SyncIndex) -> None:
        """Every blob under the prefix into the scratch index; a job on a cluster lists one prefix per task."""
        prefix = folder_prefix(self.spec.source.path)
        filters = self.spec.filters
        lister = RemoteLister(self.store, self.runner.requests, prefix, index, "src", filters,
                              lambda props, entry: props.last_modified.timestamp())
        if self.runner.cluster is not None and self.store.capabilities.lists_levels:
            await lister.by_level()
        else:
            await lister.under(prefix)
        if not lister.listed and prefix and filters.top is None and self.runner.job is None:
            # A folder URL with nothing under it is most likely a typo; AzCopy fails too. (A wildcard that
            # matches nothing, or filters that take nothing, are a successful empty copy.)
            raise BlobNotFoundError(f"no blobs under {prefix!r} in container {self.spec.source.container!r}",
                                    status=404, code="BlobNotFound", hint="check the URL (names are case-sensitive)")

    async def run(self) -> Report:
        spec = self.spec
        if not self.ctx.config.recursive:
            root, rel, props = await self._one_blob()
            return await self._run(root, lambda: iter([[(rel, props)]]), None)
        if spec.dest.exists() and not spec.dest.is_dir():
            raise UsageError(f"destination {str(spec.dest)!r} is a file: -r needs a folder")
        index = SyncIndex(self.runner.journal.path.parent)
        try:
            await self._list_into(index)
            return await self._run(spec.dest, lambda: listed_batches(index), index.totals("src"))
        finally:
            index.close()

    async def _run(self, root: Path, blobs: Callable[[], Iterator[list[tuple[str, BlobProperties]]]],
                   totals: tuple[int, int] | None) -> Report:
        """Download `blobs` (batches of relative name and properties) under `root`, or list them in a dry run."""
        spec = self.spec
        if spec.dry_run:
            return self._dry_run(root, blobs())
        job = self.runner.open_job(spec.source.display, str(spec.dest))
        report = Report(job.id, spec.source.display, str(spec.dest), kind="download",
                        listener=self.runner.progress.finished)
        self.runner.settle_missing(report, spec.filters)
        claims = NameClaims(probe(root))
        work = (item for batch in blobs() for item in self._items(root, batch, report, claims))
        self.runner.performing(root)
        await self.runner.run(report, work, totals)
        return report

    def _dry_run(self, root: Path, blobs: Iterator[list[tuple[str, BlobProperties]]]) -> Report:
        """cp --dry-run: each blob that would come down, and its local path; nothing is written or journaled."""
        spec = self.spec
        report = Report(DRY_RUN, spec.source.display, str(spec.dest), kind="download")
        self.runner.settle_missing(report, spec.filters)
        for rel, props in (pair for batch in blobs for pair in batch):
            try:
                target = str(safe_join(root, rel))
            except UnsafeNameError as exc:
                self.runner.settle(report, None, FileResult(rel, props.name, props.size, FileStatus.FAILED,
                                                            reason=str(exc), exit_code=ExitCode.PARTIAL))
                continue
            self.on_action(Action("download", rel, f"to {target}", props.size))
            self.runner.settle(report, None, FileResult(rel, props.name, props.size, FileStatus.PLANNED,
                                                        reason=f"would download to {target}"))
        return report

    def _items(self, root: Path, blobs: list[tuple[str, BlobProperties]], report: Report, claims: NameClaims
               ) -> Iterator[WorkItem]:
        """Journal rows for these blobs (a resumed job's own included), and work for those not done yet."""
        journal = self.runner.journal
        assert self.runner.job is not None
        rows = journal.add_files(
            self.runner.job.id, ((rel, b.name, b.size, destination_mtime_ns(b), 0) for rel, b in blobs))
        for rel, props in blobs:
            row = rows[rel]
            try:
                target = safe_join(root, rel)
                other = claims.claim(rel)
                if other is not None:
                    raise UnsafeNameError(claims.message(rel, other))
            except UnsafeNameError as exc:
                self.runner.settle(report, row, FileResult(rel, props.name, props.size, FileStatus.FAILED,
                                                           reason=str(exc), exit_code=ExitCode.PARTIAL))
                continue
            if (row.state is FileState.COMMITTED and row.etag == props.etag and target.is_file()
                    and target.stat().st_size == props.size):
                self.runner.settle(report, None, FileResult(rel, props.name, props.size, FileStatus.SKIPPED,
                                                            reason="already downloaded by this job"))
                continue
            yield WorkItem(row, FileOp.of_blob(OpKind.DOWNLOAD, rel, props))
