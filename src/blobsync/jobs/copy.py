"""A blob-to-blob copy job: list the source (one blob, or a prefix with filters), merge with the journal, and copy
each blob under the budgets, the destination's service reading the source where it can."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path

from blobsync.backends.base import BlobProperties, Store
from blobsync.engine.context import EngineContext
from blobsync.engine.listing import RemoteLister, one_blob
from blobsync.engine.mtime import destination_mtime_ns
from blobsync.errors import BlobNotFoundError
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import JobRunner, RemoteRunner, WorkItem, listed_batches
from blobsync.jobs.spec import CopySpec
from blobsync.journal import FileState, JobKind, JobRow
from blobsync.journal.index import SyncIndex
from blobsync.naming import folder_prefix
from blobsync.report import DRY_RUN, Action, FileResult, FileStatus, Report


class CopyJob:
    """One run of a copy job between two stores (new or resumed): `await run()`."""

    def __init__(self, spec: CopySpec, ctx: EngineContext, source: Store, *, job: JobRow | None = None,
                 on_action: Callable[[Action], None] | None = None, cluster: RemoteRunner | None = None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.source = source
        self.on_action = on_action or (lambda action: None)
        self.runner = JobRunner(JobKind.COPY, ctx, job, extra_options={"filters": spec.filters.text or None},
                                cluster=cluster)

    async def run(self) -> Report:
        if not self.spec.many:
            props = await self._one_blob()
            name = posixpath.basename(props.name)
            return await self._run(lambda: iter([[(name, props)]]), None)
        index = SyncIndex(self.runner.journal.path.parent)
        try:
            await self._list_into(index)
            return await self._run(lambda: listed_batches(index), index.totals("src"))
        finally:
            index.close()

    async def _one_blob(self) -> BlobProperties:
        return await one_blob(self.source, self.runner.requests, self.spec.source.path, "copy")

    async def _list_into(self, index: SyncIndex) -> None:
        prefix = folder_prefix(self.spec.source.path)
        lister = RemoteLister(self.source, self.runner.requests, prefix, index, "src", self.spec.filters,
                              lambda props, entry: props.last_modified.timestamp())
        await lister.under(prefix)
        if not lister.listed and prefix and self.spec.filters.top is None and self.runner.job is None:
            raise BlobNotFoundError(f"no blobs under {prefix!r} in container {self.spec.source.container!r}",
                                    status=404, code="BlobNotFound", hint="check the URL (names are case-sensitive)")

    def _name(self, rel: str) -> str:
        """The destination name of the blob at `rel` under the source."""
        return self.spec.dest.path if not self.spec.many else folder_prefix(self.spec.dest.path) + rel

    async def _run(self, blobs: Callable[[], Iterator[list[tuple[str, BlobProperties]]]],
                   totals: tuple[int, int] | None) -> Report:
        spec, runner = self.spec, self.runner
        if spec.dry_run:
            return self._dry_run(blobs())
        job = runner.open_job(spec.source.display, spec.dest.display)
        report = Report(job.id, spec.source.display, spec.dest.display, kind="copy",
                        listener=runner.progress.finished)
        runner.settle_missing(report, spec.filters)
        if self.ctx.config.create_container:
            await runner.requests(self.ctx.store.create_container)
        perform = runner.performing(Path(), self.source)
        work = (item for batch in blobs() for item in self._items(batch, report))
        await runner.run(report, work, totals)
        if perform.copier is not None and perform.copier.fallback is not None:
            report.notes.append(f"copied through this machine: {perform.copier.fallback}")
        return report

    def _dry_run(self, blobs: Iterator[list[tuple[str, BlobProperties]]]) -> Report:
        spec = self.spec
        report = Report(DRY_RUN, spec.source.display, spec.dest.display, kind="copy")
        self.runner.settle_missing(report, spec.filters)
        for rel, props in (pair for batch in blobs for pair in batch):
            name = self._name(rel)
            self.on_action(Action("copy", rel, f"to {name}", props.size))
            self.runner.settle(report, None, FileResult(rel, name, props.size, FileStatus.PLANNED,
                                                        reason=f"would copy to {name}"))
        return report

    def _items(self, blobs: list[tuple[str, BlobProperties]], report: Report) -> Iterator[WorkItem]:
        """Journal rows for these blobs (a resumed job's own included), and work for those not done yet."""
        assert self.runner.job is not None
        rows = self.runner.journal.add_files(self.runner.job.id, (
            (rel, self._name(rel), props.size, destination_mtime_ns(props), 0) for rel, props in blobs))
        for rel, props in blobs:
            row = rows[rel]
            if row.state is FileState.COMMITTED and (row.size, row.mtime_ns) == (props.size,
                                                                                  destination_mtime_ns(props)):
                self.runner.settle(report, None, FileResult(rel, row.blob, props.size, FileStatus.SKIPPED,
                                                            reason="already copied by this job"))
                continue
            yield WorkItem(row, FileOp.of_blob(OpKind.COPY, rel, props, row.blob))
