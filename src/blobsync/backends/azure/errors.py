"""Turns Azure error responses and transport failures into blobsync exceptions, explaining 403s plainly."""

from __future__ import annotations

import re
from dataclasses import dataclass

from blobsync.backends.answers import parse_retry_after
from blobsync.backends.azure.location import BlobLocation
from blobsync.errors import (
    AuthError,
    BlobNotFoundError,
    ConflictError,
    ContainerNotFoundError,
    CopySourceError,
    CorruptedInTransitError,
    InvalidBlockListError,
    ServiceError,
    StagingRefusedError,
    ThrottledError,
    TransientError,
)
from blobsync.redact import redact

_TAG_RE = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.S) for tag in ("Code", "Message", "AuthenticationErrorDetail")}


def _xml_field(body: bytes, tag: str) -> str | None:
    match = _TAG_RE[tag].search(body.decode("utf-8", "replace"))
    return match.group(1).strip() if match else None


def explain_sas(loc: BlobLocation, method: str) -> str | None:
    sas = loc.sas_token
    return sas.explain(method, loc.scheme) if sas is not None else None


@dataclass(frozen=True)
class _Answer:
    """An error response, read: what the message and the error class are made of."""

    status: int
    code: str
    message: str
    detail: str  # AuthenticationErrorDetail
    short: str  # '<what>: HTTP <status> <code>'
    retry_after: float | None


_CONFLICT_CODES = frozenset(("BlobAlreadyExists", "ConditionNotMet", "TargetConditionNotMet", "LeaseIdMissing",
                             "LeaseIdMismatchWithBlobOperation"))
# (status, code) -> the error class and the text used when the service sent no message.
_BY_CODE: dict[tuple[int, str], tuple[type[ServiceError], str]] = {
    (400, "Md5Mismatch"): (CorruptedInTransitError, "body corrupted in transit"),
    (400, "Crc64Mismatch"): (CorruptedInTransitError, "body corrupted in transit"),
    (400, "InvalidBlobOrBlock"): (StagingRefusedError, "InvalidBlobOrBlock"),
    (400, "InvalidBlockList"): (InvalidBlockListError, "InvalidBlockList"),
    (500, "OperationTimedOut"): (ThrottledError, "throttled"),
}
_BY_STATUS: dict[int, tuple[type[TransientError], str]] = {
    429: (ThrottledError, "throttled"), 503: (ThrottledError, "throttled"),
    408: (TransientError, "server error"), 500: (TransientError, "server error"),
    502: (TransientError, "server error"), 504: (TransientError, "server error"),
}


def error_from_response(
    *,
    status: int,
    headers: dict[str, str],
    body: bytes,
    method: str,
    what: str,
    loc: BlobLocation,
    credential_description: str,
) -> ServiceError:
    """Build the exception for an error response. `what` names the operation and blob for the message."""
    code = headers.get("x-ms-error-code") or _xml_field(body, "Code") or ""
    answer = _Answer(status, code, (_xml_field(body, "Message") or "").split("\n", 1)[0].strip(),
                     _xml_field(body, "AuthenticationErrorDetail") or "",
                     redact(f"{what}: HTTP {status}{' ' + code if code else ''}"),
                     parse_retry_after(headers.get("retry-after")))
    copy = _copy_error(answer)
    if copy is not None:
        return copy
    if status in (401, 403):
        reason = _auth_reason(answer, loc, method, credential_description)
        return AuthError(f"{answer.short}: {reason}", status=status, code=code)
    if status == 404:
        return _not_found(answer, loc, what)
    if status in (409, 412) and code in _CONFLICT_CODES:
        return ConflictError(f"{answer.short}: {answer.message or code}", status=status, code=code)
    if (status, code) in _BY_CODE:
        cls, fallback = _BY_CODE[status, code]
        text = fallback if cls is CorruptedInTransitError else answer.message or fallback
        if issubclass(cls, TransientError):
            return cls(f"{answer.short}: {text}", status=status, code=code, retry_after=answer.retry_after)
        return cls(f"{answer.short}: {text}", status=status, code=code)
    if status in _BY_STATUS:
        transient, fallback = _BY_STATUS[status]
        return transient(f"{answer.short}: {answer.message or fallback}", status=status, code=code,
                         retry_after=answer.retry_after)
    return ServiceError(f"{answer.short}: {redact(answer.message) or 'request failed'}", status=status, code=code)


def _copy_error(answer: _Answer) -> ServiceError | None:
    """A copy the service refused because of its source (code names it, whatever the status)."""
    if answer.code == "CannotVerifyCopySource":
        return CopySourceError(f"{answer.short}: the service could not read the copy source (it answered "
                               f"{answer.message or 'nothing'})", status=answer.status, code=answer.code)
    if answer.code == "SourceConditionNotMet":
        return ConflictError(f"{answer.short}: the copy source changed since it was listed", status=answer.status,
                             code=answer.code)
    return None


def _auth_reason(answer: _Answer, loc: BlobLocation, method: str, credential_description: str) -> str:
    """Why a 401/403 happened, in words: the SAS read locally first, then what the credential is."""
    if "not valid in the specified time frame" in answer.detail:
        return explain_sas(loc, method) or "the SAS is expired or not yet valid"
    if answer.code == "AuthorizationPermissionMismatch":
        return explain_sas(loc, method) or "the credentials lack a permission this operation needs"
    if answer.code == "UnauthorizedBlobOverwrite":
        return "the SAS can create blobs but not overwrite them: it needs 'w' (write)"
    reason = explain_sas(loc, method)
    if reason is not None:
        return reason
    if credential_description.startswith("no credentials"):
        return ("no credentials were found: add a SAS to the URL, or set AZURE_STORAGE_CONNECTION_STRING "
                "or AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY")
    if ("Signature did not match" in answer.detail or answer.code == "AuthenticationFailed"
            or "key" in credential_description):
        return (f"authentication failed with the {credential_description}: check that it is the "
                f"current key or SAS of account {loc.account!r}")
    return f"access denied using the {credential_description}"


def _not_found(answer: _Answer, loc: BlobLocation, what: str) -> ServiceError:
    if answer.code == "ContainerNotFound":
        return ContainerNotFoundError(f"container {loc.container!r} does not exist at {loc.account_url}",
                                      status=404, code=answer.code, hint="create it, or pass --create-container")
    if answer.code == "ResourceNotFound" and what.startswith("create container"):
        return ContainerNotFoundError(f"{answer.short}: account not found", status=404, code=answer.code)
    return BlobNotFoundError(f"{answer.short}: not found", status=404, code=answer.code)

