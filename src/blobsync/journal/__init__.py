"""The SQLite journal of jobs, files and blocks; the only package that touches the database."""

from blobsync.journal.states import RESUMABLE, FileState, JobKind, JobState
from blobsync.journal.store import BlockRow, CommittedBlob, FileRow, JobRow, Journal, default_journal_path

__all__ = ["RESUMABLE", "BlockRow", "CommittedBlob", "FileRow", "FileState", "JobKind", "JobRow", "JobState",
           "Journal", "default_journal_path"]
