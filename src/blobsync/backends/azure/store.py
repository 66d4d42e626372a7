"""The Azure Blob data path: signs and sends each Blob REST call, maps answers to records and errors.

Every call goes through the HTTP client in backends/http.py: ranged GETs land in the caller's buffer, bodies
leave from it."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

from blobsync._version import __version__
from blobsync.backends.answers import check_read, parse_xml
from blobsync.backends.azure import rules
from blobsync.backends.azure.auth import Credential, Request, check_copy_reader, read_grant, warn_if_plain_http
from blobsync.backends.azure.batch import SubRequest, batch_body, parse_batch
from blobsync.backends.azure.errors import error_from_response
from blobsync.backends.azure.listing import (
    MONTH_NAMES,
    md5_header,
    next_marker_guess,
    parse_length,
    parse_level,
    parse_listing,
    parse_tags,
    properties_from_headers,
)
from blobsync.backends.azure.location import BlobLocation, check_blob_name
from blobsync.backends.azure.rules import is_metadata_name
from blobsync.backends.azure.writer import BlockBlobWriter
from blobsync.backends.base import (
    NO_CONDITIONS,
    BlobHeaders,
    BlobProperties,
    BlockCheck,
    Buffer,
    Capabilities,
    Conditions,
    CopySource,
    Location,
    Markers,
    Part,
    PartCheck,
    Parts,
    Pieces,
    PutResult,
    Requester,
    direct,
)
from blobsync.backends.http import HttpClient, HttpError
from blobsync.errors import (
    AuthError,
    BatchUnsupported,
    BlobNotFoundError,
    ConflictError,
    ConnectionSetupError,
    ContainerNotFoundError,
    CorruptedInTransitError,
    CredentialRenewed,
    IntegrityError,
    NetworkError,
    ServiceError,
)
from blobsync.redact import redact

log = logging.getLogger("blobsync.http")

API_VERSION = "2023-11-03"
START_FROM_VERSION = "2026-02-06"  # the first service version whose List Blobs takes startFrom
_USER_AGENT = f"blobsync/{__version__}"
# Blob properties (BlobHeaders.properties) as the headers Put Blob and Put Block List take.
_PROPERTY_HEADERS = {
    "cache_control": "x-ms-blob-cache-control",
    "content_disposition": "x-ms-blob-content-disposition",
    "content_encoding": "x-ms-blob-content-encoding",
    "content_language": "x-ms-blob-content-language",
}
RANGE_MD5_MAX = 4 * 1024 * 1024  # the largest range the service computes an MD5 of on the fly
BATCH_MAX = 256  # sub-requests in one Blob Batch


Throttle = Callable[[int], Awaitable[None]]  # takes bandwidth tokens for n bytes (the --cap-mbps bucket)


_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _http_date(second: int) -> str:
    """RFC 1123 in GMT, as email.utils.formatdate(usegmt=True) writes it (not loading email.* saves start-up)."""
    t = time.gmtime(second)
    return (f"{_DAY_NAMES[t.tm_wday]}, {t.tm_mday:02d} {MONTH_NAMES[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


class _DateCache:
    """x-ms-date changes once a second; formatting it per request is measurable on many small files."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = _http_date(second)
        return self._value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _transport_error(exc: HttpError, what: str) -> ServiceError:
    """An HttpError as the blobsync error it is: TLS and proxy credentials stop the job, the rest is retried."""
    if exc.kind == "tls":
        return ConnectionSetupError(f"{what}: {exc}")
    if exc.kind == "proxy-auth":
        return AuthError(f"{what}: {exc}")
    return NetworkError(f"{what}: {exc}")


def _blob_headers(headers: BlobHeaders, prefix: str) -> dict[str, str]:
    """Properties as request headers; Put Blob uses x-ms-blob-* names, as does Put Block List."""
    out = {f"{prefix}content-type": headers.content_type}
    if headers.content_md5 is not None:
        out[f"{prefix}content-md5"] = _b64(headers.content_md5)
    for key, value in headers.metadata.items():
        if not is_metadata_name(key):
            raise ServiceError(f"invalid metadata name {key!r}: use letters, digits and '_'")
        out[f"x-ms-meta-{key}"] = value
    if headers.tier:
        out["x-ms-access-tier"] = headers.tier
    out.update((_PROPERTY_HEADERS[key], value) for key, value in headers.properties.items())
    if headers.tags:
        out["x-ms-tags"] = urlencode(headers.tags, quote_via=quote)
    return out


def _copy_source_headers(source: CopySource) -> dict[str, str]:
    out = dict(source.headers)
    if source.etag:
        out["x-ms-source-if-match"] = source.etag  # the version listed, or the copy is refused
    return out


def _condition_headers(conditions: Conditions) -> dict[str, str]:
    out: dict[str, str] = {}
    if conditions.if_none_match_any:
        out["If-None-Match"] = "*"
    if conditions.if_match:
        out["If-Match"] = conditions.if_match
    return out


# The share of an expected last page asked for separately (see list_blobs). Azurite takes ~80 µs per listed blob
# and we ~15 µs to parse and index one: the parse of 7/8 of a page then outlasts the service's work on the last
# 1/8, which is all that is left to parse once it arrives.
_LAST_PAGE_PART = 8


class AzureContainerStore:
    """Store over the Blob REST API, signed with a SAS, Shared Key or Azure AD token."""

    page_size = 5000  # blobs per List Blobs page: the service's maximum
    capabilities = Capabilities(max_parts=rules.MAX_BLOCKS, max_part_size=rules.MAX_BLOCK_SIZE,
                                range_md5_max=RANGE_MD5_MAX, spans=True, batch_delete_max=BATCH_MAX,
                                keeps_parts=True, lists_levels=True, lists_from=True,
                                part_checks=(BlockCheck.CRC64, BlockCheck.MD5),
                                copy_max=rules.MAX_COPY_SIZE, stage_copy_max=rules.MAX_BLOCK_SIZE, copy_sources=True,
                                tags=True, tiers=rules.TIERS, properties=rules.BLOB_PROPERTIES,
                                metadata_name=rules.is_metadata_name, write_rules=rules.check_writes)
    # The emulator (Azurite) computes CRC64s in JavaScript, ~20 s of its CPU per GiB against ~1 s for MD5s.
    _emulator = dataclasses.replace(capabilities, part_checks=(BlockCheck.MD5, BlockCheck.CRC64))

    def __init__(
        self,
        loc: BlobLocation,
        credential: Credential,
        *,
        connections: int = 64,
        connect_timeout: float = 10.0,  # an Azure endpoint answers a SYN in well under a second
        read_timeout: float = 120.0,
        throttle: Throttle | None = None,
        on_wire: Callable[[int], None] | None = None,
        proxy: str | None = None,
        env: Mapping[str, str] | None = None,
        trusted: tuple[str, ...] = (),
    ) -> None:
        """`proxy` overrides the proxies of `env` (HTTPS_PROXY, NO_PROXY...); `env` also names CA bundles;
        `trusted`: the hosts beyond Azure's own that may receive this store's credential (as a copy's reader)."""
        warn_if_plain_http(loc, credential)
        self._loc = loc
        self._trusted = trusted
        if loc.path_style:
            self.capabilities = self._emulator
        self._cred = credential
        self._base = loc.container_url
        self._base_path = urlsplit(self._base).path
        self._dates = _DateCache()
        self._raw = HttpClient(loc.scheme, loc.netloc, connect_timeout=connect_timeout, stall_timeout=read_timeout,
                               throttle=throttle, on_wire=on_wire, proxy=proxy, env=env,
                               connections=connections)

    @property
    def display_url(self) -> str:
        return self._loc.display

    @property
    def container_url(self) -> str:
        return self._base

    @property
    def location(self) -> BlobLocation:
        return self._loc

    def check_name(self, name: str) -> None:
        check_blob_name(name)

    def writer(self, name: str, nonce: str) -> BlockBlobWriter:
        return BlockBlobWriter(self, name, nonce)

    async def close(self) -> None:
        try:
            await self._raw.close()
        finally:
            await self._cred.close()

    # --- transport ----------------------------------------------------------------------------------------

    async def _sign(self, method: str, name: str | None, query: list[tuple[str, str]], headers: dict[str, str],
                    body: Buffer | None) -> tuple[str, Request]:
        """The request target (path and query, SAS included) and the request with its signed headers."""
        path = self._base_path if name is None else f"{self._base_path}/{quote(name, safe='/~')}"
        headers["x-ms-date"] = self._dates.now()
        headers.setdefault("x-ms-version", API_VERSION)  # a request may need a later one (startFrom)
        headers["User-Agent"] = _USER_AGENT
        if body is not None:
            headers["Content-Length"] = str(len(body))
            headers.setdefault("Content-Type", "application/octet-stream")
        elif method in ("PUT", "POST"):
            headers["Content-Length"] = "0"
        request = Request(method, path, query, headers)
        await self._cred.authorize(request)
        qs = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
        if request.sas:
            qs = f"{qs}&{request.sas}" if qs else request.sas
        return f"{path}{'?' + qs if qs else ''}", request

    async def _call(
        self,
        method: str,
        name: str | None,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: Buffer | None,
        what: str,
        expect: tuple[int, ...],
        chunks: list[bytes] | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request. With `chunks`, a successful response body is appended there as received (no join)."""
        target, request = await self._sign(method, name, query, headers, body)
        try:
            raw = await self._raw.request(method, target, request.headers, body=body)
        except HttpError as exc:
            raise _transport_error(exc, what) from exc
        status, resp_headers, data = raw.status, raw.headers, raw.body
        if chunks is not None and status in expect:
            chunks.append(data)
            data = b""
        if log.isEnabledFor(logging.DEBUG):  # checked first: this is the hot path
            url = f"{self._loc.scheme}://{self._loc.netloc}{target}"
            log.debug("%s %s -> %d %s", method, redact(url), status, resp_headers.get("x-ms-error-code", ""))
        if status not in expect:
            raise await self._refused(request, status, resp_headers, data,
                                      "LIST" if ("comp", "list") in query else method, what)
        return status, resp_headers, data

    async def _refused(self, request: Request, status: int, headers: Mapping[str, str], body: bytes, method: str,
                       what: str) -> ServiceError:
        """The error an unexpected answer is. A 401/403 with a credential that can be renewed (a SAS provider
        whose SAS expired, a token) renews it and is retried at once, this request only: the job goes on."""
        if status in (401, 403) and await self._cred.refresh(request):
            log.info("%s: the service refused the %s; retrying with a fresh one", what, self._cred.description)
            return CredentialRenewed(f"{what}: the service refused the {self._cred.description}; renewed",
                                     status=status, retry_after=0.0)
        # A SAS given as a credential object is explained as one in the URL is ("expired at ...").
        loc = dataclasses.replace(self._loc, sas=request.sas) if request.sas and not self._loc.sas else self._loc
        return error_from_response(status=status, headers=dict(headers), body=body, method=method, what=what,
                                   loc=loc, credential_description=self._cred.description)

    # --- operations ---------------------------------------------------------------------------------------

    async def create_container(self) -> bool:
        """Create the container; False when it already existed."""
        try:
            await self._call(
                "PUT", None, [("restype", "container")], {}, None, f"create container {self._loc.container}",
                (201,),
            )
        except ServiceError as exc:
            if exc.status == 409 and exc.code == "ContainerAlreadyExists":
                return False
            raise
        return True

    async def container_exists(self) -> bool:
        try:
            await self._call(
                "GET", None, [("restype", "container"), ("comp", "list"), ("maxresults", "1")], {}, None,
                f"list container {self._loc.container}", (200,),
            )
        except ContainerNotFoundError:
            return False
        return True

    async def container_answers(self, probe_name: str) -> bool:
        """Whether the container exists, asked with a HEAD of a (missing) blob: needs only read permission,
        where listing needs list permission. Raises AuthError when even that is refused."""
        try:
            await self._call("HEAD", probe_name, [], {}, None, f"get properties of {probe_name!r}", (200,))
        except ContainerNotFoundError:
            return False
        except ServiceError as exc:
            if exc.status == 404:
                return True  # BlobNotFound: the container is there
            raise
        return True

    async def delete(self, name: str, if_match: str | None = None) -> bool:
        """Delete a blob (and its snapshots); False when it was already gone."""
        req = {"x-ms-delete-snapshots": "include"}
        if if_match:
            req["If-Match"] = if_match
        try:
            await self._call("DELETE", name, [], req, None, f"delete blob {name!r}", (202,))
        except BlobNotFoundError:
            return False
        return True

    async def delete_many(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        """Delete up to BATCH_MAX blobs (name, If-Match ETag or None) in one Blob Batch request.

        Per blob: True (deleted), False (already gone) or the error its sub-request got. BatchUnsupported when
        the service takes no batches here (the caller deletes one by one instead)."""
        parts = []
        for name, etag in items:
            headers = {"x-ms-delete-snapshots": "include"}
            if etag:
                headers["If-Match"] = etag
            target, request = await self._sign("DELETE", name, [], headers, None)
            parts.append(SubRequest("DELETE", target, {k: v for k, v in request.headers.items()
                                                       if k.lower() != "user-agent"}))
        content_type, body = batch_body(parts)
        what = f"delete {len(items)} blobs (batch)"
        try:
            _, h, data = await self._call("POST", None, [("restype", "container"), ("comp", "batch")],
                                          {"Content-Type": content_type}, body, what, (202,))
        except ServiceError as exc:
            if exc.status in (400, 404, 405, 501) and not isinstance(exc, ContainerNotFoundError):
                raise BatchUnsupported(f"{what}: {exc}", status=exc.status, code=exc.code) from exc
            raise
        try:
            answers = parse_batch(h.get("content-type"), data, len(items))
        except ValueError as exc:
            raise NetworkError(f"{what}: {exc}") from exc
        out: list[bool | ServiceError] = []
        for (name, _), answer in zip(items, answers, strict=True):
            if answer.status == 202:
                out.append(True)
                continue
            error = error_from_response(status=answer.status, headers=dict(answer.headers), body=answer.body,
                                        method="DELETE", what=f"delete blob {name!r}", loc=self._loc,
                                        credential_description=self._cred.description)
            out.append(False if isinstance(error, BlobNotFoundError) else error)
        return out

    async def stat(self, name: str) -> BlobProperties | None:
        try:
            _, h, _ = await self._call("HEAD", name, [], {}, None, f"get properties of {name!r}", (200,))
        except BlobNotFoundError:
            return None
        except ContainerNotFoundError:
            raise  # the same error a put or a listing gives: not "no such blob"
        except ServiceError as exc:
            # HEAD errors carry no body; a 404 without a code may still mean the container is gone.
            if exc.status == 404:
                return None
            raise
        return properties_from_headers(name, h)

    async def put(
        self, name: str, data: Buffer, headers: BlobHeaders, conditions: Conditions = NO_CONDITIONS
    ) -> PutResult:
        req = {"x-ms-blob-type": "BlockBlob", **_blob_headers(headers, "x-ms-blob-"),
               **_condition_headers(conditions)}
        if headers.content_md5 is not None:
            # Content-MD5 on Put Blob makes the service check the body and store it as the blob's MD5;
            # x-ms-blob-content-md5 would only make it hash the body a second time.
            req["Content-MD5"] = req.pop("x-ms-blob-content-md5")
        _, h, _ = await self._call("PUT", name, [], req, data, f"put blob {name!r}", (201,))
        return PutResult(h.get("etag", ""), md5_header(h.get("content-md5")), h.get("x-ms-version-id"))

    async def put_block(self, name: str, block_id: str, data: Buffer, check: PartCheck | None) -> None:
        req: dict[str, str] = {}
        if check is not None:
            # The service computes the named checksum of the body and refuses the block if it differs.
            req["x-ms-content-crc64" if check.kind is BlockCheck.CRC64 else "Content-MD5"] = _b64(check.value)
        await self._call(
            "PUT", name, [("comp", "block"), ("blockid", block_id)], req, data, f"put block of {name!r}",
            (201,),
        )

    async def put_block_list(
        self,
        name: str,
        blocks: Sequence[tuple[str, str]],
        headers: BlobHeaders,
        conditions: Conditions = NO_CONDITIONS,
    ) -> PutResult:
        """Commit (block ID, 'Committed' or 'Uncommitted') in order; built by hand, every entry naming its list."""
        body = (
            '<?xml version="1.0" encoding="utf-8"?><BlockList>'
            + "".join(f"<{state}>{bid}</{state}>" for bid, state in blocks)
            + "</BlockList>"
        ).encode("ascii")
        req = {**_blob_headers(headers, "x-ms-blob-"), **_condition_headers(conditions),
               "Content-Type": "application/xml"}
        _, h, _ = await self._call(
            "PUT", name, [("comp", "blocklist")], req, body, f"put block list of {name!r}", (201,)
        )
        return PutResult(h.get("etag", ""), None, h.get("x-ms-version-id"))

    async def read_into(self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *,
                        range_md5: bool = False) -> BlobProperties:
        """Read len(buf) bytes from `offset` straight into `buf` (no intermediate copies), with the blob's
        properties as of that read. A short body is a retryable NetworkError. An empty `buf` reads the whole
        blob, which must then be empty: a check that it is there (as this version)."""
        return await self._get(name, offset, len(buf), buf, if_match, range_md5 and 0 < len(buf) <= RANGE_MD5_MAX)

    async def read_span(self, name: str, offset: int, length: int, pieces: Pieces,
                        if_match: str | None = None) -> BlobProperties:
        return await self._get(name, offset, length, pieces, if_match, False)

    async def _get(self, name: str, offset: int, length: int, sink: memoryview | Pieces, if_match: str | None,
                   range_md5: bool) -> BlobProperties:
        what = f"get blob {name!r}"
        headers = {"x-ms-range": f"bytes={offset}-{offset + length - 1}"} if length else {}
        if if_match:
            headers["If-Match"] = if_match
        if range_md5:
            headers["x-ms-range-get-content-md5"] = "true"
        target, request = await self._sign("GET", name, [], headers, None)
        try:
            response = await self._raw.request("GET", target, request.headers, sink, accept=lambda status, h: (
                check_read(what, status, h, offset, length, if_match)))
        except HttpError as exc:
            raise _transport_error(exc, what) from exc
        if log.isEnabledFor(logging.DEBUG):
            log.debug("GET %s -> %d (raw)", redact(target), response.status)
        if response.status not in (200, 206):
            raise await self._refused(request, response.status, response.headers, response.body, "GET", what)
        if response.body_length != length:
            raise NetworkError(f"{what}: response cut short ({response.body_length} of {length} bytes)")
        h = response.headers
        props = properties_from_headers(name, h)
        if response.status == 200:
            return props
        total = h.get("content-range", "").rpartition("/")[2]
        return dataclasses.replace(props, size=int(total) if total.isdigit() else props.size,
                                   content_md5=md5_header(h.get("x-ms-blob-content-md5")),
                                   range_md5=props.content_md5 if range_md5 else None)

    async def read_first(self, name: str, buf: memoryview) -> tuple[BlobProperties, int]:
        """One ranged GET of the first len(buf) bytes: the answer's Content-Range gives the blob's length."""
        what = f"get blob {name!r}"
        target, request = await self._sign("GET", name, [], {"x-ms-range": f"bytes=0-{max(1, len(buf)) - 1}"},
                                           None)
        try:
            response = await self._raw.request("GET", target, request.headers, buf)
        except HttpError as exc:
            raise _transport_error(exc, what) from exc
        if response.status == 416:  # an empty blob has no byte 0
            props = await self.stat(name)
            if props is not None and props.size == 0:
                return props, 0
        if response.status not in (200, 206):
            raise await self._refused(request, response.status, response.headers, response.body, "GET", what)
        props = properties_from_headers(name, response.headers)
        total = response.headers.get("content-range", "").rpartition("/")[2]
        size = int(total) if response.status == 206 and total.isascii() and total.isdigit() else props.size
        if response.body_length != min(len(buf), size):
            raise NetworkError(f"{what}: response cut short ({response.body_length} of {min(len(buf), size)} bytes)")
        check_read(what, response.status, response.headers, 0, response.body_length, None)
        return dataclasses.replace(props, size=size, content_md5=md5_header(
            response.headers.get("x-ms-blob-content-md5")) if response.status == 206 else props.content_md5), \
            response.body_length

    async def copy_source(self, name: str, etag: str | None, reader: Location) -> CopySource:
        check_copy_reader(self._loc, self._cred, urlsplit(reader.container_url).hostname or "", self._trusted)
        url = f"{self._base}/{quote(name, safe='/~')}"
        sas, headers = await read_grant(self._cred, self._loc.account, self._loc.container, name)
        return CopySource(f"{url}?{sas}" if sas else url, url, etag, headers)

    async def copy_from(self, name: str, source: CopySource, conditions: Conditions = NO_CONDITIONS,
                        tier: str | None = None, copy_tags: bool = False) -> PutResult:
        """Copy Blob From URL: the service reads the source (up to 256 MiB) and answers once the copy is done."""
        req = {"x-ms-copy-source": source.url, "x-ms-requires-sync": "true", **_copy_source_headers(source),
               **_condition_headers(conditions)}
        if tier:
            req["x-ms-access-tier"] = tier
        if copy_tags:
            req["x-ms-copy-source-tag-option"] = "COPY"
        what = f"copy {source.display!r} to {name!r}"
        try:
            _, h, _ = await self._call("PUT", name, [], req, None, what, (202,))
        except ConflictError as exc:
            # The emulator answers a failed source condition as ConditionNotMet: with no condition of ours on the
            # destination, it can only be the source's.
            if exc.code != "ConditionNotMet" or conditions.if_match:
                raise
            raise ConflictError(f"{what}: HTTP 412 SourceConditionNotMet: the copy source changed since it was "
                                "listed", status=412, code="SourceConditionNotMet") from None
        if h.get("x-ms-copy-status", "success") != "success":
            raise ServiceError(f"{what}: the service answered copy status {h.get('x-ms-copy-status')!r}")
        return PutResult(h.get("etag", ""), None, h.get("x-ms-version-id"))

    async def tags(self, name: str) -> Mapping[str, str]:
        """Get Blob Tags."""
        try:
            _, _, body = await self._call("GET", name, [("comp", "tags")], {}, None, f"get tags of {name!r}", (200,))
        except AuthError as exc:
            raise AuthError(f"{exc.message}; reading blob index tags needs the 't' (tag) permission in a SAS",
                            status=exc.status, code=exc.code) from None
        return parse_tags(body)

    async def put_block_from_url(self, name: str, block_id: str, source: CopySource, offset: int, length: int,
                                 check: PartCheck | None = None) -> None:
        req = {"x-ms-copy-source": source.url, "x-ms-source-range": f"bytes={offset}-{offset + length - 1}",
               **_copy_source_headers(source)}
        if check is not None:  # the service computes it over the bytes it read and refuses the block if they differ
            req["x-ms-source-content-crc64" if check.kind is BlockCheck.CRC64 else "x-ms-source-content-md5"] = \
                _b64(check.value)
        what = f"put block from {source.display!r} to {name!r}"
        try:
            await self._call("PUT", name, [("comp", "block"), ("blockid", block_id)], req, None, what, (201,))
        except CorruptedInTransitError:
            # No body went: the source's bytes differ from the check. Asking again would get the same answer.
            raise IntegrityError(f"{what}: the source's bytes differ from the check sent") from None

    async def list_objects(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                           request: Requester = direct, start: str = "") -> AsyncIterator[BlobProperties]:
        """Every blob under `prefix`, with properties and metadata, one page (up to 5,000) at a time.

        The next page is requested as soon as this page's marker is known, before this page is parsed: the
        service prepares page n+1 while we parse page n. Only the last page's parse overlaps nothing, so when
        `expected()` (how many blobs the caller expects in all, e.g. a sync's local file count; None while
        unknown) says the rest fits in one page, the rest is asked for as a page and a small last page.
        Each page is one `request` (the engine's request path: a failed page is retried alone)."""
        listed = 0
        split = False

        def next_size() -> int:
            nonlocal split
            total = None if expected is None or split else expected()
            if total is not None:
                left = total - listed
                if 0 < left <= self.page_size and left // _LAST_PAGE_PART:
                    split = True  # once: if the estimate was short, full pages fetch the rest
                    return left - left // _LAST_PAGE_PART
            return self.page_size

        ahead = asyncio.ensure_future(self._page(request, prefix, "", next_size(), start))
        markers = Markers(f"list blobs under {prefix or '/'!r}")
        try:
            while True:
                body = await ahead
                listed += body.count(b"<Blob>")
                guess = next_marker_guess(body)
                if guess:
                    ahead = asyncio.ensure_future(self._page(request, prefix, guess, next_size(), start))
                    # A task runs only once the loop gets control, and parsing (and the consumer of this page)
                    # never gives it: without this yield the request left only after the page was consumed.
                    await asyncio.sleep(0)
                page, marker = parse_listing(body)
                markers.next(marker)
                if marker != guess:  # an escaping the quick scan got wrong: ask again, properly
                    ahead.cancel()
                    ahead = asyncio.ensure_future(self._page(request, prefix, marker, self.page_size, start))
                for props in page:
                    yield props
                if not marker:
                    return
        finally:
            if not ahead.done():
                ahead.cancel()
                await asyncio.wait([ahead])

    async def _page(self, request: Requester, prefix: str, marker: str, size: int, start: str = "") -> bytes:
        return await request(lambda: self._list_body(prefix, marker, size, start=start))

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]:
        """One List Blobs request: up to 5,000 blobs from `marker` on, and the marker of the next page ('')."""
        return parse_listing(await self._list_body(prefix, marker))

    async def list_level(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], list[str], str]:
        """One List Blobs page with delimiter '/': the blobs directly under `prefix`, the prefixes one level
        down (each ending in '/'), and the next page's marker."""
        return parse_level(await self._list_body(prefix, marker, delimiter="/"))

    async def list_range(self, prefix: str, start: str, marker: str = "", size: int | None = None
                         ) -> tuple[list[BlobProperties], str]:
        """One List Blobs page of the blobs under `prefix` named `start` or after it (startFrom, inclusive), from
        `marker` on, and the next page's marker."""
        return parse_listing(await self._list_body(prefix, marker, size, start=start))

    async def _list_body(self, prefix: str, marker: str, size: int | None = None, delimiter: str = "",
                         start: str = "") -> bytes:
        query = [("restype", "container"), ("comp", "list"), ("include", "metadata"),
                 ("maxresults", str(size or self.page_size))]
        if prefix:
            query.append(("prefix", prefix))
        if delimiter:
            query.append(("delimiter", delimiter))
        if marker:
            query.append(("marker", marker))
        headers = {}
        if start:
            query.append(("startFrom", start))
            headers["x-ms-version"] = START_FROM_VERSION
        _, _, body = await self._call("GET", None, query, headers, None, f"list blobs in {self._loc.container}",
                                      (200,))
        return body

    async def get_block_list(self, name: str, which: str = "all") -> Parts:
        try:
            _, h, body = await self._call(
                "GET", name, [("comp", "blocklist"), ("blocklisttype", which)], {}, None,
                f"get block list of {name!r}", (200,),
            )
        except BlobNotFoundError:
            return Parts((), (), None)
        root = parse_xml(body, f"get block list of {name!r}")

        def blocks(tag: str) -> tuple[Part, ...]:
            return tuple(
                Part(b.findtext("Name") or "", parse_length(b.findtext("Size"), name))
                for b in root.iterfind(f"{tag}/Block")
            )

        return Parts(blocks("CommittedBlocks"), blocks("UncommittedBlocks"), h.get("etag"))

