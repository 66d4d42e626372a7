"""The SQLite journal of jobs, files and blocks; the only package that touches the database."""

from blobsync.journal.store import BlockRow, CommittedBlob, FileRow, JobRow, Journal, default_journal_path

__all__ = ["BlockRow", "CommittedBlob", "FileRow", "JobRow", "Journal", "default_journal_path"]
