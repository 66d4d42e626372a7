"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from blobsync._version import __version__
from blobsync.api import (
    clean_jobs,
    copy,
    copy_async,
    list_jobs,
    resume,
    resume_async,
    show_job,
    sync,
    sync_async,
    watch,
    watch_async,
)
from blobsync.config import CheckMd5, Overwrite, TransferConfig
from blobsync.engine.context import Progress
from blobsync.errors import (
    AuthError,
    BlobsyncError,
    ContainerNotFoundError,
    ExitCode,
    IntegrityError,
    SourceError,
    UsageError,
)
from blobsync.report import FileResult, FileStatus, Report
from blobsync.syncing.compare import CompareMode
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action, DeleteMode

__all__ = [
    "Action",
    "AuthError",
    "BlobsyncError",
    "CheckMd5",
    "CompareMode",
    "ContainerNotFoundError",
    "DeleteMode",
    "ExitCode",
    "FileResult",
    "FileStatus",
    "Filters",
    "IntegrityError",
    "Overwrite",
    "Progress",
    "Report",
    "SourceError",
    "TransferConfig",
    "UsageError",
    "__version__",
    "clean_jobs",
    "copy",
    "copy_async",
    "list_jobs",
    "resume",
    "resume_async",
    "show_job",
    "sync",
    "sync_async",
    "watch",
    "watch_async",
]
