"""Deleting many blobs through the job's request path, a bounded number at a time, each outcome reported."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from blobsync.backends.base import ContainerStore, Requester
from blobsync.engine.tasks import for_each
from blobsync.errors import AuthError, BlobsyncError, ContainerNotFoundError
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


class Outcome(Enum):
    DELETED = "deleted"
    GONE = "already gone"  # nothing to delete: a retry after a lost answer, or someone else deleted it
    FAILED = "failed"


OnDone = Callable[[Doomed, Outcome, BlobsyncError | None], None]

# Errors no other blob will escape: stop the whole run with the one clear error.
FATAL = (AuthError, ContainerNotFoundError)


class BlobDeleter:
    """Deletes blobs with at most `workers` requests of its own in flight (the request path's limit applies too)."""

    def __init__(self, store: ContainerStore, request: Requester, workers: int, on_done: OnDone) -> None:
        self.store = store
        self.request = request
        self.workers = max(1, workers)
        self.on_done = on_done

    async def run(self, items: Iterable[Doomed] | AsyncIterable[Doomed]) -> None:
        await for_each(items, self._one, self.workers)

    async def _one(self, item: Doomed) -> None:
        try:
            gone = await self.request(lambda: self.store.delete_blob(item.name, item.etag))
        except FATAL:
            raise
        except BlobsyncError as exc:
            log.warning("%s: cannot delete: %s", item.rel, redact(str(exc)))
            self.on_done(item, Outcome.FAILED, exc)
            return
        self.on_done(item, Outcome.DELETED if gone else Outcome.GONE, None)
