"""`blobsync doctor` for Azure URLs: reads the SAS (or other credential), says what it allows, probes the endpoint."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

from blobsync.backends.azure.auth import AnonymousCredential, SasCredential, resolve_credential
from blobsync.backends.azure.location import BlobLocation
from blobsync.backends.azure.sas import Sas
from blobsync.backends.azure.store import AzureContainerStore
from blobsync.backends.base import BlobHeaders
from blobsync.backends.diagnosis import Diagnosis, Level
from blobsync.errors import AuthError, BlobsyncError, ContainerNotFoundError, TransientError

PERMISSIONS = {
    "r": "read", "a": "add", "c": "create", "w": "write", "d": "delete", "x": "delete versions",
    "y": "permanent delete", "l": "list", "t": "tags", "f": "find by tags", "m": "move", "e": "execute",
    "o": "ownership", "p": "permissions", "i": "immutability policy",
    "u": "update (queues and tables; no blob operation needs it)",
}

# What each blobsync operation needs. Uploads read too: the commit is verified and resumes ask which
# blocks the service already holds; 'c' (create) alone cannot stage blocks.
NEEDS: tuple[tuple[str, str], ...] = (
    ("upload (cp)", "rw"),
    ("download (cp)", "r"),
    ("download -r (cp)", "rl"),
    ("sync up", "rwl"),
    ("sync up --delete-destination", "rwld"),
    ("sync down", "rl"),
    ("ls", "l"),
    ("rm", "d"),
    ("rm -r", "dl"),
)

EXPIRY_WARNING = timedelta(hours=2)  # a long transfer may outlive the SAS, and blobsync cannot renew one


def _span(delta: timedelta) -> str:
    seconds = abs(delta.total_seconds())
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{seconds / 60:.0f} minutes"


def read_sas(loc: BlobLocation, diagnosis: Diagnosis, now: datetime | None = None) -> None:
    """Check the SAS fields offline: permissions, validity window, protocol, resource type and IP range."""
    sas = loc.sas_token or Sas("")
    now = now or datetime.now(UTC)
    diagnosis.add(Level.INFO, "sas", f"{sas.kind}, version {sas.fields.get('sv', '?')}")
    _read_permissions(sas, diagnosis)
    _read_validity(sas, diagnosis, now)
    if sas.protocol == "https" and loc.scheme == "http":
        diagnosis.add(Level.FAIL, "protocol", "the SAS allows HTTPS only (spr=https) but the URL is http://: "
                      "use https://", auth=True)
    elif sas.protocol:
        diagnosis.add(Level.OK, "protocol", f"spr={sas.protocol}")
    _read_resource(sas, diagnosis)
    if "sip" in sas.fields:
        diagnosis.add(Level.INFO, "ip range", f"only requests from {unquote(sas.fields['sip'])} are allowed: "
                      "this machine's public address must be in that range")


def _read_permissions(sas: Sas, diagnosis: Diagnosis) -> None:
    perms = sas.permissions
    if not perms:
        diagnosis.add(Level.FAIL, "permissions", "the SAS has no 'sp' (permissions) field: it allows nothing",
                      auth=True)
    else:
        named = ", ".join(PERMISSIONS.get(c, f"'{c}'?") for c in perms)
        diagnosis.add(Level.OK, "permissions", f"{named} (sp={perms})")
    for operation, needed in NEEDS:
        lacking = [f"'{c}' ({PERMISSIONS[c]})" for c in needed if c not in perms]
        if lacking:
            diagnosis.missing[operation] = ", ".join(lacking)


def _read_validity(sas: Sas, diagnosis: Diagnosis, now: datetime) -> None:
    expiry = sas.expiry
    if sas.expiry_unreadable:
        diagnosis.add(Level.WARN, "expiry", f"cannot read the expiry se={unquote(sas.fields['se'])!r}")
    elif expiry is None:
        diagnosis.add(Level.INFO, "expiry", "no expiry in the SAS (a stored access policy may set one)")
    elif expiry <= now:
        diagnosis.add(Level.FAIL, "expiry", f"the SAS expired at {expiry:%Y-%m-%d %H:%M:%S}Z "
                      f"({_span(now - expiry)} ago): generate a new one", auth=True)
    elif expiry - now < EXPIRY_WARNING:
        diagnosis.add(Level.WARN, "expiry", f"the SAS expires in {_span(expiry - now)} "
                      f"({expiry:%Y-%m-%d %H:%M:%S}Z): a long transfer may outlive it (it stays resumable "
                      "with a new SAS)")
    else:
        diagnosis.add(Level.OK, "expiry", f"valid until {expiry:%Y-%m-%d %H:%M:%S}Z (in {_span(expiry - now)})")
    start = sas.start
    if start is not None and start > now:
        skew = " (or this machine's clock is behind)" if start - now < timedelta(minutes=15) else ""
        diagnosis.add(Level.FAIL, "start", f"the SAS is not valid before {start:%Y-%m-%d %H:%M:%S}Z, "
                      f"{_span(start - now)} from now{skew}", auth=True)


def _read_resource(sas: Sas, diagnosis: Diagnosis) -> None:
    fields = sas.fields
    resource = fields.get("sr")
    if resource == "b":
        diagnosis.add(Level.WARN, "resource", "a blob SAS (sr=b): it covers this one blob only, so -r, sync, "
                      "ls and uploads of other names need a container SAS (sr=c)")
        for operation in ("download -r (cp)", "sync up", "sync up --delete-destination", "sync down", "ls",
                          "rm -r"):
            before = diagnosis.missing.get(operation)
            diagnosis.missing[operation] = f"{before}, and a container SAS (sr=c)" if before \
                else "a container SAS (sr=c)"
    elif resource == "d":
        diagnosis.add(Level.INFO, "resource", "a directory SAS (sr=d): only blobs under that directory")
    if not sas.is_account_sas:
        return
    services, types = fields.get("ss", ""), fields.get("srt", "")
    if "b" not in services:
        diagnosis.add(Level.FAIL, "services", f"the account SAS does not cover the blob service (ss={services})",
                      auth=True)
    if "o" not in types:
        diagnosis.add(Level.FAIL, "resource types", f"the account SAS does not cover objects (srt={types}): "
                      "blobs cannot be read or written", auth=True)
    elif "c" not in types:
        diagnosis.add(Level.WARN, "resource types", f"the account SAS does not cover containers (srt={types}): "
                      "listing (sync, -r, ls) and --create-container will be refused")


async def diagnose(loc: BlobLocation, *, write_test: bool, env: Mapping[str, str], timeout: float,
                   proxy: str | None, trusted_suffixes: Sequence[str]) -> Diagnosis:
    """Check what the URL's credentials allow and whether the endpoint and container answer.

    With `write_test`, put a small probe blob, read it back and delete it (saying so if it cannot)."""
    credential = resolve_credential(loc, env, tuple(trusted_suffixes))
    label = "SAS in the URL (signature hidden)" if isinstance(credential, SasCredential) and loc.sas \
        else credential.description
    diagnosis = Diagnosis(loc.display, label)
    if loc.sas:
        read_sas(loc, diagnosis)
    elif isinstance(credential, AnonymousCredential):
        diagnosis.add(Level.WARN, "credential", "no credentials found: only a public container can be read. "
                      "Add a SAS to the URL, or set AZURE_STORAGE_CONNECTION_STRING or "
                      "AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY")
    else:
        diagnosis.add(Level.INFO, "credential", f"{label}: permissions are those of the key or identity")

    _report_proxy(loc, proxy, env, diagnosis)
    store = AzureContainerStore(loc, credential, connections=4, connect_timeout=timeout, read_timeout=timeout,
                                proxy=proxy, env=env)
    try:
        if await _probe_container(store, loc, diagnosis) and write_test:
            await _write_test(store, loc, diagnosis)
    finally:
        await store.close()
    return diagnosis


def _report_proxy(loc: BlobLocation, proxy: str | None, env: Mapping[str, str], diagnosis: Diagnosis) -> None:
    """Which proxy the requests take (the endpoint check below says whether it answers through it)."""
    from blobsync.backends.http import proxy_for

    chosen, source = proxy_for(f"{loc.account_url}/", proxy, env)
    if chosen is None:
        diagnosis.add(Level.INFO, "proxy", f"none: requests go straight to {loc.netloc}{source}")
    else:
        diagnosis.add(Level.INFO, "proxy", f"{chosen} (from {source})")


async def _probe_container(store: AzureContainerStore, loc: BlobLocation, diagnosis: Diagnosis) -> bool:
    started = time.monotonic()
    try:
        try:
            exists = await store.container_exists()
        except AuthError as exc:
            if exc.code != "AuthorizationPermissionMismatch":
                raise
            # Listing refused (no 'l'): a HEAD of a missing blob still tells whether the container is there.
            exists = await store.container_answers(f"{loc.path.rstrip('/')}/.blobsync-doctor-probe".lstrip("/"))
    except AuthError as exc:
        diagnosis.add(Level.FAIL, "endpoint", f"answered, but refused the credentials: {exc}", auth=True)
        return False
    except TransientError as exc:
        diagnosis.add(Level.FAIL, "endpoint", f"{loc.account_url} does not answer: {exc}")
        return False
    except BlobsyncError as exc:
        diagnosis.add(Level.FAIL, "endpoint", str(exc))
        return False
    diagnosis.add(Level.OK, "endpoint", f"{loc.account_url} answered in {1000 * (time.monotonic() - started):.0f} ms")
    if not exists:
        diagnosis.add(Level.FAIL, "container", f"container {loc.container!r} does not exist: create it, or pass "
                      "--create-container to cp or sync")
        return False
    diagnosis.add(Level.OK, "container", f"{loc.container!r} exists")
    return True


async def _write_test(store: AzureContainerStore, loc: BlobLocation, diagnosis: Diagnosis) -> None:
    folder = loc.path.rstrip("/")
    name = f"{folder + '/' if folder else ''}.blobsync-doctor-{secrets.token_hex(6)}"
    body = b"blobsync doctor write test\n"
    headers = BlobHeaders("text/plain", None, {})  # Put Blob stores the MD5 it computes
    try:
        await store.put(name, body, headers)
    except (AuthError, ContainerNotFoundError) as exc:
        diagnosis.add(Level.FAIL, "write test", f"cannot write: {exc}", auth=isinstance(exc, AuthError))
        return
    except BlobsyncError as exc:
        diagnosis.add(Level.FAIL, "write test", f"cannot write: {exc}")
        return
    try:
        props = await store.stat(name)
        if props is None or props.size != len(body):
            diagnosis.add(Level.FAIL, "write test", f"wrote {name!r} but could not read it back")
        else:
            diagnosis.add(Level.OK, "write test", f"wrote and read back {name!r}")
    except AuthError as exc:
        diagnosis.add(Level.WARN, "write test", f"wrote {name!r} but cannot read it back: {exc}")
    try:
        await store.delete(name)
        diagnosis.add(Level.OK, "delete test", f"deleted {name!r}")
    except BlobsyncError as exc:
        diagnosis.add(Level.WARN, "delete test", f"cannot delete the probe blob {name!r} ({exc}): remove it by hand")
