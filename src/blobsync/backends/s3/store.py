"""An S3 bucket as a copy's source: HEAD, ListObjectsV2 and ranged GETs, signed with SigV4, over aiohttp."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import NoReturn
from urllib.parse import unquote

from blobsync.backends.answers import check_read, parse_retry_after, parse_xml
from blobsync.backends.base import (
    NO_CONDITIONS,
    BlobHeaders,
    BlobProperties,
    Buffer,
    Capabilities,
    ChunkedWriter,
    Conditions,
    CopySource,
    Location,
    Pieces,
    PutResult,
    Requester,
    direct,
    each_object,
)
from blobsync.backends.http import Accept, HttpClient, HttpError
from blobsync.backends.s3.location import Endpoint, S3Location
from blobsync.backends.s3.sigv4 import AwsCredentials, canonical_query, canonical_uri, sign
from blobsync.errors import (
    AuthError,
    BlobNotFoundError,
    ConflictError,
    ContainerNotFoundError,
    NetworkError,
    ServiceError,
    ThrottledError,
    TransientError,
    UsageError,
)

log = logging.getLogger("blobsync")
_PROPERTY_HEADERS = (("cache_control", "cache-control"), ("content_disposition", "content-disposition"),
                     ("content_encoding", "content-encoding"), ("content_language", "content-language"))
PAGE = 1000  # keys per ListObjectsV2 page: the service's maximum


def _md5_of_etag(etag: str) -> bytes | None:
    """An object written in one piece has its MD5 as its ETag; a multipart one ('<hex>-<parts>') has none."""
    text = etag.strip('"')
    if len(text) == 32 and "-" not in text:
        try:
            return bytes.fromhex(text)
        except ValueError:
            return None
    return None


def _size(text: str, name: str) -> int:
    """A size the service sent, or a ServiceError naming it: a bad answer is never a traceback."""
    if not (text.isascii() and text.isdigit()):
        raise ServiceError(f"{name!r}: the service sent a size that is not a number ({text[:40]!r})")
    return int(text)


def _when(text: str | None, parse: Callable[[str], datetime]) -> datetime:
    """A time the service sent (the epoch when it sent none or nothing readable: only filters and mtimes read it)."""
    try:
        return parse(text) if text else datetime.fromtimestamp(0, UTC)
    except (ValueError, TypeError):
        return datetime.fromtimestamp(0, UTC)


def _props_from_headers(name: str, h: Mapping[str, str]) -> BlobProperties:
    modified = h.get("last-modified")
    return BlobProperties(
        name, _size(h.get("content-length", "0"), name), h.get("etag", ""), _when(modified, parsedate_to_datetime),
        _md5_of_etag(h.get("etag", "")), h.get("content-type"),
        {k[len("x-amz-meta-"):]: v for k, v in h.items() if k.startswith("x-amz-meta-")},
        "BlockBlob", None, properties={key: h[header] for key, header in _PROPERTY_HEADERS if h.get(header)})


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _listed(body: bytes) -> tuple[list[BlobProperties], str]:
    """One ListObjectsV2 page: its objects and the continuation token ('' after the last page)."""
    root = parse_xml(body, "list objects")
    out: list[BlobProperties] = []
    token, truncated = "", False
    for node in root:
        tag = _local(node.tag)
        if tag == "Contents":
            fields = {_local(child.tag): child.text or "" for child in node}
            etag = fields.get("ETag", "")
            stamp = fields.get("LastModified", "").replace("Z", "+00:00")
            out.append(BlobProperties(fields.get("Key", ""), _size(fields.get("Size", "0"), fields.get("Key", "")),
                                      etag, _when(stamp, datetime.fromisoformat),
                                      _md5_of_etag(etag), None, {}, "BlockBlob", None))
        elif tag == "NextContinuationToken":
            token = node.text or ""
        elif tag == "IsTruncated":
            truncated = (node.text or "").strip().lower() == "true"
    return out, token if truncated else ""


def _answer(body: bytes) -> tuple[str, str]:
    """The error code and the first line of the message of an S3 error body ('' where there is none)."""
    try:
        root = parse_xml(body, "") if body else None
    except ServiceError:
        return "", ""
    if root is None:
        return "", ""
    return root.findtext("Code") or "", (root.findtext("Message") or "").split("\n", 1)[0]


def _error(status: int, headers: Mapping[str, str], body: bytes, what: str) -> ServiceError:
    code, message = _answer(body)
    short = f"{what}: HTTP {status}{' ' + code if code else ''}"
    retry_after = parse_retry_after(headers.get("retry-after"))
    if status in (401, 403):
        return AuthError(f"{short}: {message or 'access denied'} (check AWS_ACCESS_KEY_ID, "
                         "AWS_SECRET_ACCESS_KEY and the bucket's policy)", status=status, code=code)
    if code == "NoSuchBucket":
        return ContainerNotFoundError(f"{short}: the bucket does not exist", status=status, code=code)
    if status == 404:
        return BlobNotFoundError(f"{short}: {message or 'not found'}", status=status, code=code)
    if status in (304, 412):
        return ConflictError(f"{short}: the object changed", status=412, code="ConditionNotMet")
    if status == 503 or code == "SlowDown":
        return ThrottledError(f"{short}: {message or 'slow down'}", status=status, code=code, retry_after=retry_after)
    if status >= 500 or status == 408:
        return TransientError(f"{short}: {message or 'server error'}", status=status, code=code,
                              retry_after=retry_after)
    return ServiceError(f"{short}: {message or 'request failed'}", status=status, code=code)


class S3Store:
    """One bucket, read as a copy's source (the bytes pass through this machine: the destination's service cannot
    sign requests to S3). Writes are refused: blobsync writes to Azure."""

    capabilities = Capabilities(max_parts=10_000, max_part_size=5 * 1024 ** 3, spans=True, writes=False)

    def __init__(self, loc: S3Location, endpoint: Endpoint, creds: AwsCredentials | None, *, connections: int,
                 read_timeout: float, on_wire: Callable[[int], None] | None = None, proxy: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._loc = loc
        self._endpoint = endpoint
        self._creds = creds
        self._http = HttpClient(endpoint.scheme, endpoint.netloc, connect_timeout=10.0, stall_timeout=read_timeout,
                                on_wire=on_wire, proxy=proxy, env=env, connections=connections)
        if endpoint.scheme == "http" and creds is not None and not endpoint.netloc.startswith(("127.", "localhost",
                                                                                               "[::1]")):
            log.warning("%s is plain http: the signed requests travel unencrypted; use https://", endpoint.netloc)

    @property
    def location(self) -> S3Location:
        return self._loc

    @property
    def display_url(self) -> str:
        return self._loc.display

    @property
    def container_url(self) -> str:
        return self._loc.container_url

    def check_name(self, name: str) -> None:
        self._source_only()

    async def _call(self, method: str, key: str | None, query: Mapping[str, str], headers: Mapping[str, str],
                    what: str, expect: tuple[int, ...], sink: memoryview | Pieces | None = None,
                    accept: Accept | None = None) -> tuple[int, Mapping[str, str], bytes, int]:
        path = self._endpoint.base_path + ("/" + key if key is not None else "/")
        sent = dict(headers) if self._creds is None else sign(
            self._creds, self._endpoint.region, method, self._endpoint.netloc, path, query, headers)
        target = canonical_uri(path) + ("?" + canonical_query(query) if query else "")
        try:
            response = await self._http.request(method, target, sent, sink, accept=accept)
        except HttpError as exc:
            raise NetworkError(f"{what}: {exc}") from exc
        if response.status not in expect:
            raise _error(response.status, response.headers, response.body, what)
        return response.status, response.headers, response.body, response.body_length

    async def stat(self, name: str) -> BlobProperties | None:
        try:
            _, h, _, _ = await self._call("HEAD", name, {}, {}, f"head {self._loc.bucket}/{name}", (200,))
        except BlobNotFoundError:
            return None
        return _props_from_headers(name, h)

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]:
        query = {"list-type": "2", "max-keys": str(PAGE), "prefix": prefix, "encoding-type": "url"}
        if marker:
            query["continuation-token"] = marker
        _, _, body, _ = await self._call("GET", None, query, {}, f"list s3://{self._loc.bucket}/{prefix}", (200,))
        page, token = _listed(body)
        # encoding-type=url: keys come percent-encoded, so that any byte survives the XML.
        return [BlobProperties(unquote(p.name), p.size, p.etag, p.last_modified, p.content_md5, None, {},
                               p.blob_type) for p in page], token

    def list_objects(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                     request: Requester = direct, start: str = "") -> AsyncIterator[BlobProperties]:
        if start:
            raise UsageError("listing from a name is not offered for s3:// (capabilities.lists_from is False)")
        return each_object(self.list_page, prefix, request)

    async def list_level(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], list[str], str]:
        raise UsageError("listing one level is not offered for s3:// (capabilities.lists_levels is False)")

    async def list_range(self, prefix: str, start: str, marker: str = "", size: int | None = None
                         ) -> tuple[list[BlobProperties], str]:
        raise UsageError("listing from a name is not offered for s3:// (capabilities.lists_from is False)")

    async def read_into(self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *,
                        range_md5: bool = False) -> BlobProperties:
        return await self._get(name, offset, len(buf), buf if len(buf) else None, if_match)

    async def read_span(self, name: str, offset: int, length: int, pieces: Pieces,
                        if_match: str | None = None) -> BlobProperties:
        return await self._get(name, offset, length, pieces, if_match)

    async def _get(self, name: str, offset: int, length: int, sink: memoryview | Pieces | None,
                   if_match: str | None) -> BlobProperties:
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"} if length else {}
        if if_match:
            headers["If-Match"] = if_match
        what = f"get {self._loc.bucket}/{name}"
        status, h, _, got = await self._call("GET", name, {}, headers, what, (200, 206), sink, accept=lambda st, hs: (
            check_read(what, st, hs, offset, length, if_match)))
        if got != length:
            raise NetworkError(f"{what}: response cut short ({got} of {length} bytes)")
        props = _props_from_headers(name, h)
        total = h.get("content-range", "").rpartition("/")[2]
        if status == 206 and total.isdigit():
            return BlobProperties(props.name, int(total), props.etag, props.last_modified, props.content_md5,
                                  props.content_type, props.metadata, props.blob_type, None,
                                  properties=props.properties)
        return props

    async def read_first(self, name: str, buf: memoryview) -> tuple[BlobProperties, int]:
        props = await self.stat(name)  # S3 answers a range past a short object's end with 416: size it first
        if props is None:
            raise BlobNotFoundError(f"get {self._loc.bucket}/{name}: not found", status=404, code="NoSuchKey")
        n = min(len(buf), props.size)
        if n:
            props = await self.read_into(name, 0, buf[:n], props.etag or None)
        return props, n

    def _source_only(self) -> NoReturn:
        raise UsageError(f"{self._loc.display}: s3:// URLs are a copy's source only (blobsync writes to Azure)")

    async def create_container(self) -> bool:
        self._source_only()

    async def put(self, name: str, data: Buffer, headers: BlobHeaders,
                  conditions: Conditions = NO_CONDITIONS) -> PutResult:
        self._source_only()

    def writer(self, name: str, nonce: str) -> ChunkedWriter:
        self._source_only()

    async def copy_source(self, name: str, etag: str | None, reader: Location) -> CopySource:
        self._source_only()

    async def copy_from(self, name: str, source: CopySource, conditions: Conditions = NO_CONDITIONS,
                        tier: str | None = None, copy_tags: bool = False) -> PutResult:
        self._source_only()

    async def tags(self, name: str) -> Mapping[str, str]:
        raise UsageError(f"{self._loc.display}: S3 object tags are not read (capabilities.tags is False)")

    async def delete(self, name: str, if_match: str | None = None) -> bool:
        self._source_only()

    async def delete_many(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        self._source_only()

    async def close(self) -> None:
        await self._http.close()
