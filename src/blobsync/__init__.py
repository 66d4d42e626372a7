"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from blobsync._version import __version__
from blobsync.api import clean_jobs, copy, copy_async, list_jobs, resume, resume_async, show_job
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

__all__ = [
    "AuthError",
    "BlobsyncError",
    "CheckMd5",
    "ContainerNotFoundError",
    "ExitCode",
    "FileResult",
    "FileStatus",
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
]
