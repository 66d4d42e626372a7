"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from blobsync._version import __version__

from blobsync.api import clean_jobs, copy, copy_async, list_jobs, resume, resume_async, show_job  # noqa: E402
from blobsync.config import Overwrite, TransferConfig  # noqa: E402
from blobsync.engine.context import Progress  # noqa: E402
from blobsync.errors import (  # noqa: E402
    AuthError,
    BlobsyncError,
    ContainerNotFoundError,
    ExitCode,
    IntegrityError,
    SourceError,
    UsageError,
)
from blobsync.report import FileResult, FileStatus, Report  # noqa: E402

__all__ = [
    "AuthError",
    "BlobsyncError",
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
