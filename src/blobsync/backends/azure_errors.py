"""Turns Azure error responses and transport failures into blobsync exceptions, explaining 403s plainly."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import unquote

from blobsync.errors import (
    AuthError,
    BlobNotFoundError,
    ConflictError,
    ContainerNotFoundError,
    CorruptedInTransitError,
    InvalidBlockListError,
    NetworkError,
    ServiceError,
    ThrottledError,
    TransientError,
)
from blobsync.location import BlobLocation
from blobsync.redact import redact

_TAG_RE = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.S) for tag in ("Code", "Message", "AuthenticationErrorDetail")}

# What each kind of request needs from a SAS 'sp' field.
_NEEDED_PERMISSION = {
    "PUT": ("w", "write"),
    "GET": ("r", "read"),
    "HEAD": ("r", "read"),
    "DELETE": ("d", "delete"),
    "LIST": ("l", "list"),  # not an HTTP method: what _call passes for a List Blobs request
}


def _xml_field(body: bytes, tag: str) -> str | None:
    match = _TAG_RE[tag].search(body.decode("utf-8", "replace"))
    return match.group(1).strip() if match else None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: either a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from email.utils import parsedate_to_datetime  # an HTTP date here is rare: not loaded at start-up

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def parse_sas_time(value: str) -> datetime | None:
    value = unquote(value)
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def explain_sas(loc: BlobLocation, method: str, now: datetime | None = None) -> str | None:
    """Read the SAS fields locally and say what is wrong with them for `method`, or None if nothing is."""
    fields = loc.sas_fields
    if not fields:
        return None
    now = now or datetime.now(UTC)
    expiry = parse_sas_time(fields.get("se", "")) if "se" in fields else None
    if expiry is not None and expiry <= now:
        return f"the SAS expired at {expiry:%Y-%m-%d %H:%M:%S}Z: generate a new one"
    start = parse_sas_time(fields.get("st", "")) if "st" in fields else None
    if start is not None and start > now:
        return f"the SAS is not valid before {start:%Y-%m-%d %H:%M:%S}Z (check the clock, or the 'st' field)"
    if fields.get("spr") == "https" and loc.scheme == "http":
        return "the SAS allows HTTPS only (spr=https) but the URL is http://"
    perms = unquote(fields.get("sp", ""))
    need = _NEEDED_PERMISSION.get(method.upper())
    if need and perms and need[0] not in perms:
        if need[0] == "w" and "c" in perms:
            return (
                f"the SAS has permissions '{perms}': 'c' (create) without 'w' (write) cannot stage blocks "
                "or overwrite; generate one with 'w'"
            )
        return f"the SAS has permissions '{perms}' and lacks '{need[0]}' ({need[1]}): generate one that has it"
    return None


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
    message = (_xml_field(body, "Message") or "").split("\n", 1)[0].strip()
    detail = _xml_field(body, "AuthenticationErrorDetail") or ""
    short = redact(f"{what}: HTTP {status}{' ' + code if code else ''}")
    retry_after = parse_retry_after(headers.get("retry-after"))

    if status in (401, 403):
        reason = None
        if "not valid in the specified time frame" in detail:
            reason = explain_sas(loc, method) or "the SAS is expired or not yet valid"
        elif code == "AuthorizationPermissionMismatch":
            reason = explain_sas(loc, method) or "the credentials lack a permission this operation needs"
        elif code == "UnauthorizedBlobOverwrite":
            reason = "the SAS can create blobs but not overwrite them: it needs 'w' (write)"
        else:
            reason = explain_sas(loc, method)
        if reason is None:
            if credential_description.startswith("no credentials"):
                reason = (
                    "no credentials were found: add a SAS to the URL, or set AZURE_STORAGE_CONNECTION_STRING "
                    "or AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY"
                )
            elif ("Signature did not match" in detail or code == "AuthenticationFailed"
                  or "key" in credential_description):
                reason = (f"authentication failed with the {credential_description}: check that it is the "
                          f"current key or SAS of account {loc.account!r}")
            else:
                reason = f"access denied using the {credential_description}"
        return AuthError(f"{short}: {reason}", status=status, code=code)
    if status == 404:
        if code == "ContainerNotFound":
            return ContainerNotFoundError(
                f"container {loc.container!r} does not exist at {loc.account_url}",
                status=status,
                code=code,
                hint="create it, or pass --create-container",
            )
        if code == "ResourceNotFound" and what.startswith("create container"):
            return ContainerNotFoundError(f"{short}: account not found", status=status, code=code)
        return BlobNotFoundError(f"{short}: not found", status=status, code=code)
    if status in (409, 412) and code in (
        "BlobAlreadyExists",
        "ConditionNotMet",
        "TargetConditionNotMet",
        "LeaseIdMissing",
        "LeaseIdMismatchWithBlobOperation",
    ):
        return ConflictError(f"{short}: {message or code}", status=status, code=code)
    if status == 400 and code == "Md5Mismatch":
        return CorruptedInTransitError(f"{short}: body corrupted in transit", status=status, code=code)
    if status == 400 and code == "InvalidBlockList":
        return InvalidBlockListError(f"{short}: {message or code}", status=status, code=code)
    if status in (429, 503) or (status == 500 and code == "OperationTimedOut"):
        return ThrottledError(
            f"{short}: {message or 'throttled'}", status=status, code=code, retry_after=retry_after
        )
    if status in (408, 500, 502, 504):
        return TransientError(f"{short}: {message or 'server error'}", status=status, code=code,
                              retry_after=retry_after)
    return ServiceError(f"{short}: {redact(message) or 'request failed'}", status=status, code=code)


def network_error(what: str, exc: BaseException) -> NetworkError:
    """A transport failure (refused, reset, timed out) as a retryable error with a readable message."""
    text = redact(str(exc)) or type(exc).__name__
    return NetworkError(f"{what}: {type(exc).__name__}: {text}")
