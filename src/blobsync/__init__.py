"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from blobsync._version import __version__

# A library logs through "blobsync" and leaves where it goes to its host (no "No handlers" warning either).
logging.getLogger("blobsync").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from blobsync import aio
    from blobsync.api import (
        JobSummary,
        clean_jobs,
        copy,
        copy_async,
        diagnose,
        list_blobs,
        list_jobs,
        make_container,
        remove,
        resume,
        resume_async,
        show_job,
        sync,
        sync_async,
        watch,
        watch_async,
    )
    from blobsync.backends.azure.doctor import Diagnosis, Finding
    from blobsync.backends.base import BlobProperties
    from blobsync.client import Client
    from blobsync.config import CheckMd5, Overwrite, TransferConfig
    from blobsync.errors import (
        AuthError,
        BlobNotFoundError,
        BlobsyncError,
        ContainerNotFoundError,
        ExitCode,
        IntegrityError,
        JobBusyError,
        Scope,
        SourceError,
        TransferFailedError,
        UsageError,
    )
    from blobsync.events import BaseSubscriber, Progress, QueuedFile, Subscriber
    from blobsync.filters import Filters
    from blobsync.options import Answer, CompareMode, DeleteMode
    from blobsync.report import Action, FileResult, FileStatus, Report

# The public names load on first use (PEP 562): `import blobsync` and the CLI's start-up pay only for the modules a
# command needs (a no-op sync never loads the doctor, watch, remove or download code, nor watchfiles). Type
# checkers read the imports above.
_HOMES = {
    "aio": "blobsync.aio",
    "JobSummary": "blobsync.api", "clean_jobs": "blobsync.api", "copy": "blobsync.api", "copy_async": "blobsync.api",
    "diagnose": "blobsync.api", "list_blobs": "blobsync.api", "list_jobs": "blobsync.api",
    "make_container": "blobsync.api", "Answer": "blobsync.options", "remove": "blobsync.api",
    "resume": "blobsync.api", "resume_async": "blobsync.api", "show_job": "blobsync.api", "sync": "blobsync.api",
    "sync_async": "blobsync.api", "watch": "blobsync.api", "watch_async": "blobsync.api",
    "BlobProperties": "blobsync.backends.base", "Client": "blobsync.client",
    "CheckMd5": "blobsync.config", "Overwrite": "blobsync.config", "TransferConfig": "blobsync.config",
    "Diagnosis": "blobsync.backends.azure.doctor", "Finding": "blobsync.backends.azure.doctor",
    "Progress": "blobsync.events",
    "AuthError": "blobsync.errors", "BlobNotFoundError": "blobsync.errors", "BlobsyncError": "blobsync.errors",
    "ContainerNotFoundError": "blobsync.errors", "ExitCode": "blobsync.errors", "IntegrityError": "blobsync.errors",
    "JobBusyError": "blobsync.errors",
    "Scope": "blobsync.errors", "SourceError": "blobsync.errors", "TransferFailedError": "blobsync.errors",
    "UsageError": "blobsync.errors",
    "BaseSubscriber": "blobsync.events", "QueuedFile": "blobsync.events", "Subscriber": "blobsync.events",
    "Action": "blobsync.report", "FileResult": "blobsync.report", "FileStatus": "blobsync.report",
    "Report": "blobsync.report",
    "CompareMode": "blobsync.options",
    "Filters": "blobsync.filters",
    "DeleteMode": "blobsync.options",
}


if not TYPE_CHECKING:  # hidden from type checkers, which would otherwise take any misspelt name as Any

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'blobsync' has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if name == "aio" else getattr(module, name)
        globals()[name] = value  # once loaded, a plain module attribute
        return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Action",
    "Answer",
    "AuthError",
    "BaseSubscriber",
    "BlobNotFoundError",
    "BlobProperties",
    "BlobsyncError",
    "CheckMd5",
    "Client",
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
    "JobBusyError",
    "JobSummary",
    "Overwrite",
    "Progress",
    "QueuedFile",
    "Report",
    "Scope",
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
    "make_container",
    "remove",
    "resume",
    "resume_async",
    "show_job",
    "sync",
    "sync_async",
    "watch",
    "watch_async",
]
