"""Transfer events for library users: the subscriber protocol (queued, progress, done) and a no-op base."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from blobsync.report import FileResult


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
