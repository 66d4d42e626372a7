"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from blobsync import aio
from blobsync._version import __version__
from blobsync.api import (
    JobSummary,
    clean_jobs,
    copy,
    copy_async,
    diagnose,
    list_blobs,
    list_jobs,
    remove,
    resume,
    resume_async,
    show_job,
    sync,
    sync_async,
    watch,
    watch_async,
)
from blobsync.backends.base import BlobProperties
from blobsync.config import CheckMd5, Overwrite, TransferConfig
from blobsync.doctor import Diagnosis, Finding
from blobsync.engine.context import Progress
from blobsync.errors import (
    AuthError,
    BlobNotFoundError,
    BlobsyncError,
    ContainerNotFoundError,
    ExitCode,
    IntegrityError,
    SourceError,
    TransferFailedError,
    UsageError,
)
from blobsync.events import BaseSubscriber, QueuedFile, Subscriber
from blobsync.report import FileResult, FileStatus, Report
from blobsync.syncing.compare import CompareMode
from blobsync.syncing.filters import Filters
from blobsync.syncing.job import Action, DeleteMode

__all__ = [
    "Action",
    "AuthError",
    "BaseSubscriber",
    "BlobNotFoundError",
    "BlobProperties",
    "BlobsyncError",
    "CheckMd5",
    "CompareMode",
    "ContainerNotFoundError",
    "DeleteMode",
    "Diagnosis",
    "ExitCode",
    "FileResult",
    "FileStatus",
    "Filters",
    "Finding",
    "IntegrityError",
    "JobSummary",
    "Overwrite",
    "Progress",
    "QueuedFile",
    "Report",
    "SourceError",
    "Subscriber",
    "TransferConfig",
    "TransferFailedError",
    "UsageError",
    "__version__",
    "aio",
    "clean_jobs",
    "copy",
    "copy_async",
    "diagnose",
    "list_blobs",
    "list_jobs",
    "remove",
    "resume",
    "resume_async",
    "show_job",
    "sync",
    "sync_async",
    "watch",
    "watch_async",
]
