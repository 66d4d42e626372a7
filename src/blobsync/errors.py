"""The one exception tree of blobsync, with the exit code each kind of failure maps to."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, ClassVar

from blobsync.redact import redact

if TYPE_CHECKING:
    from blobsync.report import Report


class ExitCode(IntEnum):
    """Process exit codes a script can act on (documented in docs/cli.md)."""

    OK = 0
    PARTIAL = 1  # some files failed, the rest were transferred
    USAGE = 2
    AUTH = 3
    INTEGRITY = 4
    INTERRUPTED = 130


class Scope(IntEnum):
    """How far a failure reaches, once any retries are spent: decided here, by the error's class, for every
    caller (the file pool, the deleter, watch rounds)."""

    FILE = 0  # this file (or blob) failed; the others go on
    JOB = 1  # no other file of the job can escape it (network gone, disk full): stop the job, resumable
    RUN = 2  # nothing later can fare better either (credentials, usage, a missing container): stop for good


class BlobsyncError(Exception):
    """Base of every error blobsync raises on purpose; `str(err)` is one line for a user."""

    exit_code: ExitCode = ExitCode.PARTIAL
    scope: ClassVar[Scope] = Scope.FILE
    retryable: ClassVar[bool] = False  # the same request may succeed if sent again (the request path retries it)
    job_id: str | None = None  # set when the error stopped a job: the job to resume
    report: Report | None = None  # and what that job had done by then (files done, failed, bytes sent)

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        # Redacted at birth, so no str(), repr() or traceback of a blobsync error can carry a secret.
        message = redact(message)
        super().__init__(message)
        self.message = message
        self.hint = redact(hint) if hint else hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled as its class and fields (a worker process or a Dask worker sends it back to the client); the
        # report of the job it stopped stays behind: it holds the job's live listeners.
        state = {k: v for k, v in self.__dict__.items() if k != "report"}
        return _restore, (type(self), self.args, state)


def _restore(cls: type[BlobsyncError], args: tuple[object, ...], state: dict[str, object]) -> BlobsyncError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class UsageError(BlobsyncError):
    """Bad flags, URL or arguments: nothing was transferred."""

    exit_code = ExitCode.USAGE
    scope = Scope.RUN


class JobBusyError(UsageError):
    """The job is being run already: by another process, or by another thread of this one."""


class DroppedError(BlobsyncError):
    """A Client's background call dropped by `close(cancel=True)` before it finished (its message names the job
    to resume, if it had started one)."""

    exit_code = ExitCode.INTERRUPTED


class TransferFailedError(BlobsyncError):
    """Raised by the library with `raise_on_error=True` when files failed; `.report` holds the details."""

    report: Report  # always set: what the job did, failures included

    def __init__(self, report: Report) -> None:
        first = report.failures[0] if report.failures else None
        detail = f": {first.rel}: {first.reason}" if first else ""
        more = f" (and {report.files_failed - 1} more)" if report.files_failed > 1 else ""
        super().__init__(f"{report.files_failed} file(s) failed{detail}{more}")
        self.report = report
        self.exit_code = report.exit_code


# --- local side -------------------------------------------------------------------------------------------


class SourceError(BlobsyncError):
    """A local file could not be read (missing, unreadable, not a regular file)."""


class SourceChangedError(SourceError):
    """A local file changed while it was being uploaded; nothing of it was committed."""


class LocalWriteError(BlobsyncError):
    """A local file could not be written (permission, invalid name)."""


class DiskFullError(LocalWriteError):
    """The local disk is full: the partial file is kept so the download resumes once there is room."""

    scope = Scope.JOB


class UnsafeTargetError(LocalWriteError):
    """A symbolic link (or another odd file) sits where a download would write: nothing is written through it."""


class TargetBusyError(LocalWriteError):
    """Another run is writing the same local file (its partial file is locked), or replaced it meanwhile."""


class UnsafeNameError(BlobsyncError):
    """A blob name that would escape the target folder or cannot be a local file name."""


# --- service side -----------------------------------------------------------------------------------------


class ServiceError(BlobsyncError):
    """The storage service answered with an error that retrying will not fix."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.code = code


class AuthError(ServiceError):
    """401/403: credentials missing, expired, or lacking a permission."""

    exit_code = ExitCode.AUTH
    scope = Scope.RUN


class ContainerNotFoundError(ServiceError, FileNotFoundError):
    """The container does not exist (on a read as on a write); also a FileNotFoundError."""

    scope = Scope.RUN


class BlobNotFoundError(ServiceError, FileNotFoundError):
    """The blob does not exist; also a FileNotFoundError, as code that reads files expects."""


class ConflictError(ServiceError):
    """A condition failed: the blob exists (overwrite false) or changed under us (ETag)."""


class InvalidBlockListError(ServiceError):
    """Put Block List named blocks the service no longer has (expired, discarded, or foreign IDs)."""


class ConnectionSetupError(ServiceError):
    """The connection itself cannot be made to work (the TLS certificate is not trusted): retrying cannot help."""

    scope = Scope.RUN


class StagingRefusedError(ServiceError):
    """A part was refused because the object holds staged parts another writer left (another tool's upload):
    the writer can clear them (ChunkedWriter.clear_stale) and the file starts again."""


class CopySourceError(ServiceError):
    """The destination's service could not read a copy's source (a firewall, a private endpoint, another cloud, a
    SAS it may not use): the bytes can still go through this machine (--s2s-via-client)."""


class BatchUnsupported(ServiceError):
    """The service takes no Blob Batch requests here: delete one blob per request instead."""


class IntegrityError(BlobsyncError):
    """What the service holds does not match what was sent (length, block list or MD5)."""

    exit_code = ExitCode.INTEGRITY


class UnpinnedReadError(IntegrityError):
    """A read that needs several requests of a blob the service names no version (ETag) of: its ranges could come
    from two versions, so it is refused."""


class ChecksumMismatchError(IntegrityError):
    """The whole file's MD5 differs from the blob's Content-MD5; `digest` is the MD5 of what arrived."""

    def __init__(self, message: str, *, digest: bytes | None = None) -> None:
        super().__init__(message)
        self.digest = digest


class TransientError(ServiceError):
    """A failure worth retrying: throttling, server busy, timeouts, dropped connections, corrupted bodies.

    Once the request path has spent its retries, no other file would fare better: the job stops, resumable."""

    scope = Scope.JOB
    retryable = True

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code)
        self.retry_after = retry_after


class CredentialRenewed(TransientError):
    """The service refused a credential that has been renewed since (an expired SAS from a provider): resend."""


class ThrottledError(TransientError):
    """429, 503 ServerBusy or 500 OperationTimedOut: the service asks us to slow down."""


class NetworkError(TransientError):
    """The connection failed, was reset, or stalled past the timeout."""


class CorruptedInTransitError(TransientError):
    """The service rejected a body whose Content-MD5 did not match: resend it."""
