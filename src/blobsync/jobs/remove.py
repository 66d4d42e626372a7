"""Removing blobs: one named blob, or (recursively) every blob under a prefix that the filters admit."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable

from blobsync.backends.base import BlobProperties, Store
from blobsync.engine.context import RequestPath
from blobsync.engine.delete import BlobDeleter, Doomed, Outcome
from blobsync.engine.listing import blobs_at
from blobsync.errors import BlobNotFoundError, BlobsyncError, ExitCode, UsageError
from blobsync.jobs.spec import RemoveSpec
from blobsync.naming import folder_prefix
from blobsync.report import NO_JOB, Action, FileResult, FileStatus, Report

log = logging.getLogger("blobsync")


class RemoveJob:
    """Deletes what a RemoveSpec names, with bounded concurrency; each blob's outcome goes to the report."""

    def __init__(self, spec: RemoveSpec, store: Store, requests: RequestPath, *,
                 on_action: Callable[[Action], None] | None = None) -> None:
        self.spec = spec
        self.store = store
        self.requests = requests  # the one request path: its limit, retries and counters
        self.progress = requests.progress
        self.on_action = on_action or (lambda action: None)

    async def run(self) -> Report:
        spec = self.spec
        report = Report(NO_JOB, spec.target.display, "", kind="remove", listener=self.progress.finished)
        try:
            if spec.recursive or spec.list_of_files:
                await self._many(report)
            else:
                await self._one(report)
        finally:
            report.retries = self.requests.retrier.retries
            report.throttled = self.requests.limiter.throttled
            report.duration = time.monotonic() - report.started
        return report

    async def _one(self, report: Report) -> None:
        path = self.spec.target.path
        if not path or path.endswith("/"):
            raise UsageError(f"{self.spec.target.display} names a container or folder, not a blob: add -r "
                             "(--recursive) to remove everything under it")
        props = await self.requests(lambda: self.store.stat(path))
        if props is None:
            async for _ in blobs_at(self.store, path + "/", self.requests):
                raise UsageError(f"{path!r} is a folder: add -r (--recursive) to remove the blobs under it")
            raise BlobNotFoundError(f"blob {path!r} not found in {self.spec.target.container_url}", status=404,
                                    code="BlobNotFound")
        await self._deleter(report).run([self._doomed(path.rsplit("/", 1)[-1], props)])

    async def _many(self, report: Report) -> None:
        source = self._listed(report) if self.spec.list_of_files else blobs_at(self.store, self.spec.target.path,
                                                                         self.requests)
        await self._deleter(report).run(self._chosen(source))

    async def _chosen(self, source: AsyncIterator[tuple[str, BlobProperties]]) -> AsyncIterator[Doomed]:
        async for rel, props in source:
            if self.spec.filters.matches(rel, props.last_modified.timestamp()):
                yield self._doomed(rel, props)

    def _doomed(self, rel: str, props: BlobProperties) -> Doomed:
        self.progress.queued(rel, props.name, props.size)
        self.on_action(Action("delete", rel, "dry run" if self.spec.dry_run else "remove", props.size))
        return Doomed(rel, props.name, props.size)

    def _deleter(self, report: Report) -> BlobDeleter | _DryRun:
        def done(item: Doomed, outcome: Outcome, error: BlobsyncError | None) -> None:
            if outcome is Outcome.DELETED:
                report.add(FileResult(item.rel, item.name, item.size, FileStatus.DELETED))
            elif outcome is Outcome.GONE:
                report.add(FileResult(item.rel, item.name, item.size, FileStatus.SKIPPED, reason="already gone"))
            else:
                report.add(FileResult(item.rel, item.name, item.size, FileStatus.FAILED, reason=str(error),
                                      exit_code=error.exit_code if error else ExitCode.PARTIAL))

        if self.spec.dry_run:
            return _DryRun(report)
        return BlobDeleter(self.store, self.requests, self.spec.concurrency, done, batch=self.spec.batch)

    async def _listed(self, report: Report) -> AsyncIterator[tuple[str, BlobProperties]]:
        """The blobs --list-of-files names (relative to the URL), each looked up: a missing one is reported."""
        assert self.spec.list_of_files is not None
        prefix = folder_prefix(self.spec.target.path)
        try:
            lines = self.spec.list_of_files.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read --list-of-files {str(self.spec.list_of_files)!r}: "
                             f"{exc.strerror or exc}") from exc
        for line in lines:
            rel = line.strip().lstrip("/")
            if not rel or rel.startswith("#"):
                continue
            name = prefix + rel
            props = await self.requests(functools.partial(self.store.stat, name))
            if props is None:
                self.progress.queued(rel, name, 0)
                report.add(FileResult(rel, name, 0, FileStatus.SKIPPED, reason="not found"))
                continue
            yield rel, props


class _DryRun:
    """Stands in for the deleter in a dry run: every blob chosen is reported as one that would go."""

    def __init__(self, report: Report) -> None:
        self.report = report

    async def run(self, items: Iterable[Doomed] | AsyncIterable[Doomed]) -> None:
        if isinstance(items, AsyncIterable):
            async for item in items:
                self._add(item)
        else:
            for item in items:
                self._add(item)

    def _add(self, item: Doomed) -> None:
        self.report.add(FileResult(item.rel, item.name, item.size, FileStatus.DELETED,
                                   reason="would delete (dry run)"))
