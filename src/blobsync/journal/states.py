"""The states a job and a file pass through, as the journal stores them."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    DONE = "done"
    # A put of data a process held in memory, which ended before the put did: nothing is left to resume from.
    ABANDONED = "abandoned"


MEMORY_SOURCE = "memory:"  # the source of a put of data held in memory (a job no later run can resume)


class FileState(StrEnum):
    PENDING = "pending"  # journaled, not started
    ACTIVE = "active"  # started: its nonce (uploads) or partial file (downloads) is journaled
    COMMITTED = "committed"
    SKIPPED = "skipped"
    FAILED = "failed"
    DELETED = "deleted"  # sync: removed at the destination


# A file in one of these may have parts at the store (or on disk) worth resuming from.
RESUMABLE = frozenset((FileState.ACTIVE, FileState.FAILED))


class JobKind(StrEnum):
    UPLOAD = "upload"
    DOWNLOAD = "download"
    SYNC_UP = "sync-up"
    SYNC_DOWN = "sync-down"
    COPY = "copy"  # blob to blob
    SYNC_COPY = "sync-copy"

    @property
    def is_sync(self) -> bool:
        return self in (JobKind.SYNC_UP, JobKind.SYNC_DOWN, JobKind.SYNC_COPY)
