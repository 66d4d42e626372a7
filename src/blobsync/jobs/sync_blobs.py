"""A blob-to-blob sync: both sides listed into the index at once, compared as any sync is, the differences copied
by the destination's service (engine/s2s.py), then the destination's orphans deleted with the same safety."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

from blobsync.backends.base import Store
from blobsync.engine.context import EngineContext
from blobsync.engine.list_process import FlatLister
from blobsync.jobs.ops import FileOp, OpKind
from blobsync.jobs.runner import WorkItem, batches
from blobsync.jobs.spec import SyncSpec
from blobsync.jobs.sync import SyncJob
from blobsync.journal import JobKind
from blobsync.journal.index import Entry, SyncIndex
from blobsync.naming import folder_prefix
from blobsync.report import Action, Report


class BlobSyncJob(SyncJob):
    """One blob-to-blob sync run: `spec.source` is listed from `source`, `spec.remote` (the destination) from the
    context's store."""

    def __init__(self, spec: SyncSpec, ctx: EngineContext, source: Store, *,
                 on_action: Callable[[Action], None] | None = None,
                 confirm: Callable[[int], bool] | None = None, source_apart: FlatLister | None = None) -> None:
        assert spec.source is not None and spec.upload
        super().__init__(spec, ctx, on_action=on_action, confirm=confirm)
        self.source_loc = spec.source
        self.source = source
        self.source_apart = source_apart  # the source's folders listed by a process of its own, if given

    @staticmethod
    def job_kind(spec: SyncSpec) -> JobKind:
        return JobKind.SYNC_COPY

    @property
    def kind(self) -> str:
        return "copy"

    def _sides(self) -> tuple[str, str]:
        return self.source_loc.display, self.spec.remote.display

    async def _both(self, index: SyncIndex) -> None:
        """Both listings at once, each page a request on the job's one request path."""
        prefix = folder_prefix(self.source_loc.path)
        source = self._lister(self.source, prefix, index, "src")
        listing = asyncio.create_task(source.listing(self.source_apart))
        try:
            await self._index_remote(index, "dst")
        finally:
            if not listing.done():
                await asyncio.wait([listing])
        listing.result()
        self.local_count = index.count("src")

    async def _md5s(self, src: Entry, dst: Entry) -> tuple[Entry, bytes | None]:
        return dst, src.md5  # both stored by the service (a blob written without one compares as different)

    async def _run(self, index: SyncIndex) -> Report:
        report = await super()._run(index)
        copier = self.runner.perform.copier
        if copier is not None and copier.fallback is not None:
            report.notes.append(f"copied through this machine: {copier.fallback}")
        return report

    def _performing(self) -> None:
        self.runner.performing(Path(), self.source)

    def _work(self, index: SyncIndex, report: Report) -> Iterator[WorkItem]:
        assert self.runner.job is not None
        job_id, prefix = self.runner.job.id, self._prefix
        for batch in batches(index.todo()):
            rows = self.journal.add_files(job_id, ((e.rel, prefix + e.rel, e.size, e.mtime_ns, 0) for e, _ in batch))
            for entry, reason in batch:
                row = rows[entry.rel]
                self.on_action(Action("copy", entry.rel, reason, entry.size))
                yield WorkItem(row, FileOp.of_entry(OpKind.COPY, entry, row.blob))
