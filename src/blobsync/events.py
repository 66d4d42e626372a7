"""Transfer events for library users: the subscriber protocol (queued, progress, done), a no-op base, and the
live Progress counters a display reads."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from blobsync.redact import redact
from blobsync.report import FileResult, FileStatus

log = logging.getLogger("blobsync")


@dataclass(frozen=True)
class QueuedFile:
    """A file the job is about to transfer: its relative path, blob name and size in bytes."""

    rel: str
    blob: str
    size: int


@runtime_checkable
class Subscriber(Protocol):
    """Receives a job's events on the event loop's thread; keep each call short (no blocking I/O).

    `on_queued` once per file to transfer, `on_progress` as its bytes are acknowledged (upload) or written
    (download), `on_done` once per file with its result (transferred, skipped, failed or deleted). An exception
    raised by a subscriber is logged and otherwise ignored: a progress callback never breaks a transfer.
    """

    def on_queued(self, file: QueuedFile) -> None: ...

    def on_progress(self, rel: str, nbytes: int) -> None: ...

    def on_done(self, result: FileResult) -> None: ...


class BaseSubscriber:
    """Subclass this and override only the events you need (the others do nothing)."""

    def on_queued(self, file: QueuedFile) -> None:
        """A file was queued for transfer."""

    def on_progress(self, rel: str, nbytes: int) -> None:
        """`nbytes` more bytes of file `rel` are done."""

    def on_done(self, result: FileResult) -> None:
        """A file finished, whatever its outcome."""


@dataclass
class Progress:
    """Live counters a progress display reads, and the subscribers told of each event.

    The engine changes them only through `queued`, `advanced` and `finished`, on the event loop's thread;
    a display thread may read the counters at any time."""

    job_id: str | None = None
    files_total: int = 0  # files queued for transfer (skipped ones are not)
    files_done: int = 0
    files_failed: int = 0
    files_skipped: int = 0
    files_deleted: int = 0
    bytes_total: int = 0
    bytes_done: int = 0  # bytes of file content acknowledged by the service (or found there on resume)
    bytes_sent: int = 0  # bytes of acknowledged requests that went over the wire in this run
    bytes_moving: int = 0  # body bytes written to (or read from) the network in this run, as they move
    retries: int = 0
    concurrency: int = 0  # the adaptive request limit now
    throttled: int = 0  # throttling answers so far
    started: float = field(default_factory=time.monotonic)
    subscribers: Sequence[Subscriber] = ()
    # A sync's enumeration: objects listed (or walked) so far on each side, and whether it is still going.
    listed_src: int = 0
    listed_dst: int = 0
    listing: bool = False

    def queued(self, rel: str, blob: str, size: int, *, counted: bool = False) -> None:
        """A file is about to be transferred (`counted`: its size is in the totals already)."""
        if not counted:
            self.files_total += 1
            self.bytes_total += size
        if self.subscribers:
            self._tell("on_queued", QueuedFile(rel, blob, size))

    def listed(self, side: str, count: int) -> None:
        """`count` more objects of one side ('src' or 'dst') were listed (or walked) during enumeration."""
        if side == "src":
            self.listed_src += count
        else:
            self.listed_dst += count

    def on_wire(self, nbytes: int) -> None:
        """The HTTP client wrote (or read) `nbytes` of a body: the rate is true before a block is acknowledged."""
        self.bytes_moving += nbytes

    def advanced(self, rel: str, done: int, sent: int) -> None:
        """`done` more bytes of `rel` are complete, `sent` of them went over the wire in this run."""
        self.bytes_done += done
        self.bytes_sent += sent
        if self.subscribers:
            self._tell("on_progress", rel, done)

    def finished(self, result: FileResult) -> None:
        if result.status is FileStatus.TRANSFERRED:
            self.files_done += 1
        elif result.status is FileStatus.SKIPPED:
            self.files_skipped += 1
        elif result.status is FileStatus.DELETED:
            self.files_deleted += 1
        elif result.status is FileStatus.PLANNED:
            pass  # a dry run moves nothing
        else:
            self.files_failed += 1
        if self.subscribers:
            self._tell("on_done", result)

    def _tell(self, event: str, *args: object) -> None:
        for subscriber in self.subscribers:
            try:
                getattr(subscriber, event)(*args)
            except Exception as exc:  # a callback's bug must not fail (or corrupt) the transfer
                log.warning("subscriber %s.%s raised %s: %s", type(subscriber).__name__, event,
                            type(exc).__name__, redact(str(exc)))
