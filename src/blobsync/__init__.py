"""blobsync: fast, resumable, verified transfers between local disks and Azure Blob Storage."""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from blobsync._version import __version__ as __version__

# A library logs through "blobsync" and leaves where it goes to its host (no "No handlers" warning either).
logging.getLogger("blobsync").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from blobsync import aio as aio
    from blobsync.api import (
        JobSummary as JobSummary,
        clean_jobs as clean_jobs,
        copy as copy,
        copy_async as copy_async,
        diagnose as diagnose,
        list_blobs as list_blobs,
        list_jobs as list_jobs,
        make_container as make_container,
        remove as remove,
        resume as resume,
        resume_async as resume_async,
        show_job as show_job,
        sync as sync,
        sync_async as sync_async,
        watch as watch,
        watch_async as watch_async,
    )
    from blobsync.backends.base import BlobProperties as BlobProperties
    from blobsync.backends.diagnosis import Diagnosis as Diagnosis, Finding as Finding
    from blobsync.client import Client as Client
    from blobsync.config import CheckMd5 as CheckMd5, Overwrite as Overwrite, TransferConfig as TransferConfig
    from blobsync.errors import (
        AuthError as AuthError,
        BlobNotFoundError as BlobNotFoundError,
        BlobsyncError as BlobsyncError,
        ChecksumMismatchError as ChecksumMismatchError,
        ConflictError as ConflictError,
        ConnectionSetupError as ConnectionSetupError,
        ContainerNotFoundError as ContainerNotFoundError,
        CopySourceError as CopySourceError,
        CorruptedInTransitError as CorruptedInTransitError,
        DiskFullError as DiskFullError,
        DroppedError as DroppedError,
        ExitCode as ExitCode,
        IntegrityError as IntegrityError,
        InvalidBlockListError as InvalidBlockListError,
        JobBusyError as JobBusyError,
        LocalWriteError as LocalWriteError,
        NetworkError as NetworkError,
        Scope as Scope,
        ServiceError as ServiceError,
        SourceChangedError as SourceChangedError,
        SourceError as SourceError,
        StagingRefusedError as StagingRefusedError,
        TargetBusyError as TargetBusyError,
        ThrottledError as ThrottledError,
        TransferFailedError as TransferFailedError,
        TransientError as TransientError,
        UnpinnedReadError as UnpinnedReadError,
        UnsafeNameError as UnsafeNameError,
        UnsafeTargetError as UnsafeTargetError,
        UsageError as UsageError,
    )
    from blobsync.events import (
        BaseSubscriber as BaseSubscriber,
        Progress as Progress,
        QueuedFile as QueuedFile,
        Subscriber as Subscriber,
    )
    from blobsync.filters import Filters as Filters
    from blobsync.options import (
        Answer as Answer,
        CompareMode as CompareMode,
        DeleteMode as DeleteMode,
        MaxDelete as MaxDelete,
    )
    from blobsync.report import Action as Action, FileResult as FileResult, FileStatus as FileStatus, Report as Report

# The public names load on first use (PEP 562): `import blobsync` and the CLI's start-up pay only for the modules a
# command needs (a no-op sync never loads the doctor, watch, remove or download code, nor watchfiles). Type
# checkers read the imports above.
# Every error a caller can meet (blobsync.errors has two more, CredentialRenewed and BatchUnsupported, which never
# leave the request path).
_ERRORS = (
    "AuthError", "BlobNotFoundError", "BlobsyncError", "ChecksumMismatchError", "ConflictError",
    "ConnectionSetupError", "ContainerNotFoundError", "CopySourceError", "CorruptedInTransitError", "DiskFullError",
    "DroppedError", "ExitCode", "IntegrityError", "InvalidBlockListError", "JobBusyError", "LocalWriteError",
    "NetworkError", "Scope", "ServiceError", "SourceChangedError", "SourceError", "StagingRefusedError",
    "TargetBusyError", "ThrottledError", "TransferFailedError", "TransientError", "UnpinnedReadError",
    "UnsafeNameError",
    "UnsafeTargetError", "UsageError"
)
_HOMES = {
    "aio": "blobsync.aio",
    "JobSummary": "blobsync.api", "clean_jobs": "blobsync.api", "copy": "blobsync.api", "copy_async": "blobsync.api",
    "diagnose": "blobsync.api", "list_blobs": "blobsync.api", "list_jobs": "blobsync.api",
    "make_container": "blobsync.api", "Answer": "blobsync.options", "remove": "blobsync.api",
    "resume": "blobsync.api", "resume_async": "blobsync.api", "show_job": "blobsync.api", "sync": "blobsync.api",
    "sync_async": "blobsync.api", "watch": "blobsync.api", "watch_async": "blobsync.api",
    "BlobProperties": "blobsync.backends.base", "Client": "blobsync.client",
    "CheckMd5": "blobsync.config", "Overwrite": "blobsync.config", "TransferConfig": "blobsync.config",
    "Diagnosis": "blobsync.backends.diagnosis", "Finding": "blobsync.backends.diagnosis",
    "Progress": "blobsync.events",
    **dict.fromkeys(_ERRORS, "blobsync.errors"),
    "BaseSubscriber": "blobsync.events", "QueuedFile": "blobsync.events", "Subscriber": "blobsync.events",
    "Action": "blobsync.report", "FileResult": "blobsync.report", "FileStatus": "blobsync.report",
    "Report": "blobsync.report",
    "CompareMode": "blobsync.options",
    "Filters": "blobsync.filters",
    "DeleteMode": "blobsync.options",
    "MaxDelete": "blobsync.options",
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


__all__ = sorted([*_HOMES, "__version__"])  # the names _HOMES places, and the version
