"""Deleting many blobs through the job's request path, in batches where the service takes them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from blobsync.backends.base import Store
from blobsync.engine.context import RequestPath
from blobsync.engine.tasks import for_each
from blobsync.errors import BatchUnsupported, BlobsyncError, Scope
from blobsync.redact import redact

log = logging.getLogger("blobsync")


@dataclass(frozen=True)
class Doomed:
    """One blob to delete: `rel` is how the user names it, `etag` (if set) the version that may go."""

    rel: str
    name: str
    size: int
    etag: str | None = None
    key: object = None  # the caller's handle (a journal row), handed back with the outcome


def batch_enabled(env: Mapping[str, str]) -> bool:
    """Blob Batch for bulk deletes, unless BLOBSYNC_BLOB_BATCH=0 (a proxy that refuses multipart POSTs)."""
    return env.get("BLOBSYNC_BLOB_BATCH", "1").strip().lower() not in ("0", "false", "no")


class Outcome(Enum):
    DELETED = "deleted"
    GONE = "already gone"  # nothing to delete: a retry after a lost answer, or someone else deleted it
    FAILED = "failed"


OnDone = Callable[[Doomed, Outcome, BlobsyncError | None], None]

BATCHES_IN_FLIGHT = 8  # each holds up to 256 deletes: more would only queue at the service
T = TypeVar("T")


class BlobDeleter:
    """Deletes blobs in Blob Batch requests of up to 256 where the service takes them, else one per request.

    Every request goes through the job's request path (its limit, its retries, its counters). A sub-request
    the service throttled or failed for a moment is tried again on its own, under the retry policy."""

    def __init__(self, store: Store, requests: RequestPath, workers: int, on_done: OnDone, *,
                 batch: bool = True) -> None:
        self.store = store
        self.requests = requests
        self.workers = max(1, workers)
        self.on_done = on_done
        self.batching = batch and store.capabilities.batch_delete_max > 0
        self.batch_size = store.capabilities.batch_delete_max

    async def run(self, items: Iterable[Doomed] | AsyncIterable[Doomed]) -> None:
        if not self.batching:
            await for_each(items, self._one, self.workers)
            return
        await for_each(chunks(items, self.batch_size), self._batch, min(self.workers, BATCHES_IN_FLIGHT))

    async def _batch(self, chunk: list[Doomed]) -> None:
        if not self.batching:  # another batch found out meanwhile
            await for_each(chunk, self._one, self.workers)
            return
        try:
            results = await self.requests(lambda: self.store.delete_many([(d.name, d.etag) for d in chunk]))
        except BatchUnsupported as exc:
            log.info("no Blob Batch here (%s): deleting one blob per request", redact(str(exc)))
            self.batching = False
            await for_each(chunk, self._one, self.workers)
            return
        except BlobsyncError as exc:  # the whole batch failed, retries spent
            if exc.scope is not Scope.FILE:
                raise
            for item in chunk:
                self._failed(item, exc)
            return
        again = []
        for item, result in zip(chunk, results, strict=True):
            if isinstance(result, BlobsyncError) and result.scope is not Scope.FILE and not result.retryable:
                raise result
            if isinstance(result, BlobsyncError) and result.retryable:
                self.requests.retrier.note(result)
                again.append(item)
            elif isinstance(result, BlobsyncError):
                self._failed(item, result)
            else:
                self.on_done(item, Outcome.DELETED if result else Outcome.GONE, None)
        if again:
            await for_each(again, self._one, self.workers)

    async def _one(self, item: Doomed) -> None:
        try:
            gone = await self.requests(lambda: self.store.delete(item.name, item.etag))
        except BlobsyncError as exc:
            if exc.scope is not Scope.FILE:
                raise  # no other blob escapes it: stop with the one clear error
            self._failed(item, exc)
            return
        self.on_done(item, Outcome.DELETED if gone else Outcome.GONE, None)

    def _failed(self, item: Doomed, error: BlobsyncError) -> None:
        log.warning("%s: cannot delete: %s", item.rel, redact(str(error)))
        self.on_done(item, Outcome.FAILED, error)


async def chunks(items: Iterable[T] | AsyncIterable[T], size: int) -> AsyncIterator[list[T]]:
    """`items` in lists of up to `size`, taken lazily."""
    batch: list[T] = []
    if isinstance(items, AsyncIterable):
        async for item in items:
            batch.append(item)
            if len(batch) >= size:
                yield batch
                batch = []
    else:
        for item in items:
            batch.append(item)
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch
