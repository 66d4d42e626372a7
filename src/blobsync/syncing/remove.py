"""Removing blobs: one named blob, or (recursively) every blob under a prefix that the filters admit."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from blobsync.backends.base import BlobProperties, ContainerStore
from blobsync.engine.context import Progress
from blobsync.engine.retry import Retrier, RetryPolicy
from blobsync.engine.tasks import cancel_all, gather_or_cancel
from blobsync.errors import AuthError, BlobNotFoundError, BlobsyncError, ContainerNotFoundError, UsageError
from blobsync.location import BlobLocation
from blobsync.report import FileResult, FileStatus, Report
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action

log = logging.getLogger("blobsync")


@dataclass(frozen=True)
class RemoveSpec:
    target: BlobLocation
    recursive: bool = False
    filters: Filters = field(default_factory=Filters)
    dry_run: bool = False
    concurrency: int = 16
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    list_of_files: Path | None = None  # relative names, one per line, instead of listing the folder


def folder_prefix(path: str) -> str:
    """The listing prefix for the 'folder' a URL path names ('' for the whole container)."""
    return path if not path or path.endswith("/") else path + "/"


async def blobs_at(store: ContainerStore, path: str, retrier: Retrier) -> AsyncIterator[tuple[str, BlobProperties]]:
    """(relative name, properties) of the blob named `path` and of every blob under `path/`.

    One listing with `path` as its prefix answers both; names that only share the prefix ('a/bc' for 'a/b')
    are left out. Each page is one request under the retry policy; the next page is asked for before this one's
    blobs are handed out, so the service prepares it while the caller prints or deletes them."""
    prefix = folder_prefix(path)

    def fetch(marker: str) -> asyncio.Future[tuple[list[BlobProperties], str]]:
        return asyncio.ensure_future(retrier.call(functools.partial(store.list_page, path, marker)))

    ahead = fetch("")
    try:
        while True:
            page, marker = await ahead
            if marker:
                ahead = fetch(marker)
                await asyncio.sleep(0)  # let the request leave now, not when the caller next awaits
            for props in page:
                if props.name == path and path and not path.endswith("/"):
                    yield props.name.rsplit("/", 1)[-1], props
                elif props.name.startswith(prefix) and not props.name.endswith("/"):
                    yield props.name[len(prefix):], props
            if not marker:
                return
    finally:
        if not ahead.done():  # the caller stopped early: drop the page nobody will read
            ahead.cancel()
            await asyncio.wait([ahead])
            if not ahead.cancelled():
                ahead.exception()  # retrieved: a failure of a page nobody asked for is not an error


class RemoveJob:
    """Deletes what a RemoveSpec names, with bounded concurrency; each blob's outcome goes to the report."""

    def __init__(self, spec: RemoveSpec, store: ContainerStore, *, progress: Progress | None = None,
                 on_action: Callable[[Action], None] | None = None) -> None:
        self.spec = spec
        self.store = store
        self.progress = progress or Progress()
        self.on_action = on_action or (lambda action: None)
        self.retrier = Retrier(spec.policy, on_retry=self._on_retry)

    def _on_retry(self, error: BaseException, delay: float) -> None:
        self.progress.retries += 1
        log.info("retrying in %.1fs after: %s", delay, error)

    async def run(self) -> Report:
        spec = self.spec
        report = Report("-", spec.target.display, "", kind="remove", listener=self.progress.finished)
        try:
            if spec.recursive or spec.list_of_files:
                await self._many(report)
            else:
                await self._one(report)
        finally:
            report.retries = self.retrier.retries
            report.duration = time.monotonic() - report.started
        return report

    async def _one(self, report: Report) -> None:
        path = self.spec.target.path
        if not path or path.endswith("/"):
            raise UsageError(f"{self.spec.target.display} names a container or folder, not a blob: add -r "
                             "(--recursive) to remove everything under it")
        props = await self.retrier.call(lambda: self.store.get_properties(path))
        if props is None:
            async for _ in blobs_at(self.store, path + "/", self.retrier):
                raise UsageError(f"{path!r} is a folder: add -r (--recursive) to remove the blobs under it")
            raise BlobNotFoundError(f"blob {path!r} not found in {self.spec.target.container_url}")
        await self._delete(path.rsplit("/", 1)[-1], props, report)

    async def _many(self, report: Report) -> None:
        queue: asyncio.Queue[tuple[str, BlobProperties] | None] = asyncio.Queue(maxsize=1000)
        workers = max(1, self.spec.concurrency)

        async def produce() -> None:
            source = self._listed(report) if self.spec.list_of_files else blobs_at(self.store, self.spec.target.path,
                                                                             self.retrier)
            try:
                async for rel, props in source:
                    if self.spec.filters.matches(rel, props.last_modified.timestamp()):
                        self.progress.queued(rel, props.name, props.size)
                        await queue.put((rel, props))
            finally:
                for _ in range(workers):
                    await queue.put(None)

        async def consume() -> None:
            while (item := await queue.get()) is not None:
                await self._delete(*item, report)

        tasks = [asyncio.create_task(produce()), *(asyncio.create_task(consume()) for _ in range(workers))]
        try:
            await gather_or_cancel(tasks)
        except BaseException:
            await cancel_all(tasks)
            raise

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
            props = await self.retrier.call(functools.partial(self.store.get_properties, name))
            if props is None:
                self.progress.queued(rel, name, 0)
                report.add(FileResult(rel, name, 0, FileStatus.SKIPPED, reason="not found"))
                continue
            yield rel, props

    async def _delete(self, rel: str, props: BlobProperties, report: Report) -> None:
        self.on_action(Action("delete", rel, "dry run" if self.spec.dry_run else "remove", props.size))
        if self.spec.dry_run:
            report.add(FileResult(rel, props.name, props.size, FileStatus.DELETED, reason="would delete (dry run)"))
            return
        try:
            gone = await self.retrier.call(lambda: self.store.delete_blob(props.name))
        except (AuthError, ContainerNotFoundError):
            raise  # no other blob will fare better: stop with the one clear error
        except BlobsyncError as exc:
            report.add(FileResult(rel, props.name, props.size, FileStatus.FAILED, reason=str(exc),
                                  exit_code=exc.exit_code))
            return
        if gone:
            report.add(FileResult(rel, props.name, props.size, FileStatus.DELETED))
        else:
            report.add(FileResult(rel, props.name, props.size, FileStatus.SKIPPED, reason="already gone"))

