"""A complete store in this process (memory://<container>/<path>), with faults a test can inject into any verb.

It keeps what Azure keeps and refuses what Azure refuses where the engine depends on it: conditions (ETags,
create-only), staged parts apart from the committed version, one token length per object, Content-MD5 checks of
parts and writes. Containers live as long as the process, shared by every store opened on them."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Self
from urllib.parse import quote, unquote, urlsplit

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
    Part,
    PartCheck,
    Parts,
    Pieces,
    PutResult,
    Requester,
    check_conditions,
    direct,
    each_object,
)
from blobsync.backends.registry import Connection, Wire, no_credential_object, nothing_to_diagnose, register
from blobsync.checksums import part_check
from blobsync.errors import (
    BatchUnsupported,
    BlobNotFoundError,
    ConflictError,
    ContainerNotFoundError,
    CopySourceError,
    CorruptedInTransitError,
    IntegrityError,
    InvalidBlockListError,
    ServiceError,
    StagingRefusedError,
    UnsafeNameError,
    UsageError,
)

if TYPE_CHECKING:
    from blobsync.backends.diagnosis import Diagnosis

RANGE_MD5_MAX = 4 * 1024 * 1024
# The write options it keeps: those of the blob service it stands in for (its tests' stand-in for Azure).
_TIERS = ("Hot", "Cool", "Cold", "Archive")
_PROPERTIES = ("cache_control", "content_disposition", "content_encoding", "content_language")


@dataclass(frozen=True)
class MemoryLocation:
    container: str
    path: str

    @property
    def container_url(self) -> str:
        return f"memory://{self.container}"

    @property
    def display(self) -> str:
        return f"{self.container_url}/{quote(self.path, safe='/')}" if self.path else self.container_url

    def with_path(self, path: str) -> Self:
        return replace(self, path=path)

    def with_sas(self, sas: str) -> Self:
        raise UsageError(f"{self.display}: a memory:// store takes no SAS")


@dataclass
class _Object:
    data: bytes
    etag: str
    modified: datetime
    headers: BlobHeaders
    parts: tuple[Part, ...] = ()  # the parts it was committed from (none for a single put)
    part_data: Mapping[str, bytes] = field(default_factory=dict)


@dataclass
class Container:
    """One container's objects and staged parts; `faults` are raised from the verbs named."""

    name: str
    objects: dict[str, _Object] = field(default_factory=dict)
    staged: dict[str, dict[str, bytes]] = field(default_factory=dict)
    faults: Faults = field(default_factory=lambda: Faults())


@dataclass
class _Fault:
    verb: str
    error: Callable[[], BaseException]
    times: int
    after: bool  # raised after the verb took effect: the answer was lost, the work was done
    name: str | None


class Faults:
    """Errors injected into verbs (stat, list_page, read_into, put, stage, commit, parts, delete, delete_many)."""

    def __init__(self) -> None:
        self._faults: list[_Fault] = []
        self.calls: dict[str, int] = {}

    def add(self, verb: str, error: BaseException | Callable[[], BaseException], *, times: int = 1,
            after: bool = False, name: str | None = None) -> None:
        """Fail the next `times` calls of `verb` (on object `name` only, if given) with `error`; with `after`,
        each call first does its work, then fails as if its answer were lost."""
        make = error if callable(error) and not isinstance(error, BaseException) else (lambda: error)
        self._faults.append(_Fault(verb, make, times, after, name))

    def clear(self) -> None:
        self._faults.clear()

    def take(self, verb: str, name: str | None, after: bool) -> None:
        if not after:
            self.calls[verb] = self.calls.get(verb, 0) + 1
        for fault in self._faults:
            if fault.verb == verb and fault.after == after and fault.times > 0 and fault.name in (None, name):
                fault.times -= 1
                raise fault.error()


_CONTAINERS: dict[str, Container] = {}
_ETAGS = itertools.count(1)


def container(name: str, *, create: bool = True) -> Container:
    """The process's container `name` (made empty if `create` and it does not exist yet)."""
    found = _CONTAINERS.get(name)
    if found is None and create:
        found = _CONTAINERS[name] = Container(name)
    if found is None:
        raise ContainerNotFoundError(f"container {name!r} does not exist at memory://", hint="create it, or pass "
                                     "--create-container")
    return found


def drop(name: str) -> None:
    _CONTAINERS.pop(name, None)


def _etag() -> str:
    return f'"0x{next(_ETAGS):X}"'


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _check(obj: _Object | None, conditions: Conditions, what: str) -> None:
    check_conditions(obj.etag if obj is not None else None, conditions, what)


def _props(name: str, obj: _Object) -> BlobProperties:
    h = obj.headers
    return BlobProperties(name, len(obj.data), obj.etag, obj.modified, h.content_md5, h.content_type,
                          dict(h.metadata), "BlockBlob", h.tier or "Hot", properties=dict(h.properties))


def _source(source: CopySource, what: str) -> tuple[str, _Object]:
    """The object a copy reads: memory://<container>/<name>, as this version (as a service reads another's)."""
    parts = urlsplit(source.url)
    found = _CONTAINERS.get(parts.netloc)
    name = unquote(parts.path.lstrip("/"))
    obj = found.objects.get(name) if found is not None else None
    if parts.scheme != "memory" or obj is None:
        raise CopySourceError(f"{what}: HTTP 404 CannotVerifyCopySource: the source does not exist", status=404,
                              code="CannotVerifyCopySource")
    if source.etag and obj.etag != source.etag:
        raise ConflictError(f"{what}: HTTP 412 SourceConditionNotMet", status=412, code="SourceConditionNotMet")
    return name, obj


class MemoryStore:
    """Store over one in-process container."""

    capabilities = Capabilities(range_md5_max=RANGE_MD5_MAX, spans=True, batch_delete_max=256, keeps_parts=True,
                                lists_levels=True, part_checks=(BlockCheck.CRC64, BlockCheck.MD5),
                                copy_max=256 * 1024 * 1024, stage_copy_max=4000 * 1024 * 1024, copy_sources=True,
                                tags=True, tiers=_TIERS, properties=_PROPERTIES, this_process=True,
                                lists_from=True)
    page_size = 5000

    def __init__(self, location: MemoryLocation) -> None:
        self._loc = location

    @property
    def location(self) -> MemoryLocation:
        return self._loc

    @property
    def display_url(self) -> str:
        return self._loc.display

    @property
    def container_url(self) -> str:
        return self._loc.container_url

    @property
    def data(self) -> Container:
        return container(self._loc.container, create=False)

    async def _enter(self, verb: str, name: str | None = None) -> Container:
        await asyncio.sleep(0)  # a verb is a request: other tasks run meanwhile
        box = self.data
        box.faults.take(verb, name, after=False)
        return box

    def check_name(self, name: str) -> None:
        if not name or len(name) > 1024 or name.endswith("/") or "\x00" in name:
            raise UnsafeNameError(f"{name[:80]!r}: not a valid object name here")

    async def create_container(self) -> bool:
        await asyncio.sleep(0)
        if self._loc.container in _CONTAINERS:
            return False
        container(self._loc.container)
        return True

    async def stat(self, name: str) -> BlobProperties | None:
        box = await self._enter("stat", name)
        obj = box.objects.get(name)
        box.faults.take("stat", name, after=True)
        return _props(name, obj) if obj is not None else None

    def list_objects(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                     request: Requester = direct, start: str = "") -> AsyncIterator[BlobProperties]:
        if start:
            return each_object(lambda prefix, marker: self.list_range(prefix, start, marker), prefix, request)
        return each_object(self.list_page, prefix, request)

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]:
        box = await self._enter("list_page")
        names = sorted(n for n in box.objects if n.startswith(prefix) and n > unquote(marker))
        page = names[:self.page_size]
        more = len(names) > self.page_size
        box.faults.take("list_page", None, after=True)
        return [_props(n, box.objects[n]) for n in page], quote(page[-1]) if more else ""

    async def list_range(self, prefix: str, start: str, marker: str = "", size: int | None = None
                         ) -> tuple[list[BlobProperties], str]:
        box = await self._enter("list_page")
        names = sorted(n for n in box.objects if n.startswith(prefix) and n >= start and n > unquote(marker))
        page = names[:size or self.page_size]
        more = len(names) > len(page)
        box.faults.take("list_page", None, after=True)
        return [_props(n, box.objects[n]) for n in page], quote(page[-1]) if more else ""

    async def list_level(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], list[str], str]:
        box = await self._enter("list_level")
        entries: dict[str, str | None] = {}  # name (object) or prefix (ending in '/') -> object name or None
        for name in box.objects:
            if name.startswith(prefix):
                head, sep, _ = name[len(prefix):].partition("/")
                entries[prefix + head + sep] = None if sep else name
        keys = sorted(k for k in entries if k > unquote(marker))
        page = keys[:self.page_size]
        objects = [_props(k, box.objects[k]) for k in page if entries[k] is not None]
        return objects, [k for k in page if entries[k] is None], quote(page[-1]) if len(keys) > self.page_size else ""

    async def _readable(self, op: str, name: str, if_match: str | None) -> tuple[Container, _Object]:
        """The object a read asks for, as that version (404 and If-Match as the service answers them)."""
        box = await self._enter(op, name)
        obj = box.objects.get(name)
        if obj is None:
            raise BlobNotFoundError(f"get blob {name!r}: HTTP 404 BlobNotFound: not found", status=404,
                                    code="BlobNotFound")
        _check(obj, Conditions(if_match=if_match), f"get blob {name!r}")
        return box, obj

    async def read_into(self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *,
                        range_md5: bool = False) -> BlobProperties:
        box, obj = await self._readable("read_into", name, if_match)
        if len(buf) and offset + len(buf) > len(obj.data):
            raise ServiceError(f"get blob {name!r}: HTTP 416 InvalidRange", status=416, code="InvalidRange")
        if not len(buf) and obj.data:
            raise ServiceError(f"get blob {name!r}: the whole blob does not fit an empty buffer")
        chunk = obj.data[offset:offset + len(buf)]
        buf[:] = chunk
        props = _props(name, obj)
        if range_md5 and 0 < len(buf) <= RANGE_MD5_MAX:
            props = replace(props, range_md5=hashlib.md5(chunk).digest())
        box.faults.take("read_into", name, after=True)
        return props

    async def read_span(self, name: str, offset: int, length: int, pieces: Pieces,
                        if_match: str | None = None) -> BlobProperties:
        box, obj = await self._readable("read_span", name, if_match)
        if offset + length > len(obj.data):
            raise ServiceError(f"get blob {name!r}: HTTP 416 InvalidRange", status=416, code="InvalidRange")
        data, at = memoryview(obj.data)[offset:offset + length], 0
        while at < length:
            view = await pieces.next()
            if view is None:
                raise ServiceError(f"get blob {name!r}: the range does not fit the pieces given")
            n = min(len(view), length - at)
            view[:n] = data[at:at + n]
            at += n
            if n == len(view):
                pieces.full(view)
        box.faults.take("read_span", name, after=True)
        return _props(name, obj)

    async def read_first(self, name: str, buf: memoryview) -> tuple[BlobProperties, int]:
        box, obj = await self._readable("read_first", name, None)
        chunk = obj.data[:len(buf)]
        buf[:len(chunk)] = chunk
        box.faults.take("read_first", name, after=True)
        return _props(name, obj), len(chunk)

    async def put(self, name: str, data: Buffer, headers: BlobHeaders,
                  conditions: Conditions = NO_CONDITIONS) -> PutResult:
        box = await self._enter("put", name)
        body = bytes(data)
        digest = hashlib.md5(body).digest()
        if headers.content_md5 is not None and headers.content_md5 != digest:
            raise CorruptedInTransitError(f"put blob {name!r}: HTTP 400 Md5Mismatch: body corrupted in transit",
                                          status=400, code="Md5Mismatch")
        _check(box.objects.get(name), conditions, f"put blob {name!r}")
        obj = _Object(body, _etag(), _now(), replace(headers, content_md5=digest))
        box.objects[name] = obj
        box.staged.pop(name, None)
        box.faults.take("put", name, after=True)
        return PutResult(obj.etag, digest)

    def writer(self, name: str, nonce: str) -> MemoryWriter:
        return MemoryWriter(self, name, nonce)

    async def tags(self, name: str) -> Mapping[str, str]:
        box = await self._enter("tags", name)
        obj = box.objects.get(name)
        if obj is None:
            raise BlobNotFoundError(f"get tags of {name!r}: HTTP 404 BlobNotFound", status=404, code="BlobNotFound")
        return dict(obj.headers.tags)

    async def copy_source(self, name: str, etag: str | None, reader: Location) -> CopySource:
        url = f"{self._loc.container_url}/{quote(name)}"
        return CopySource(url, url, etag)

    async def copy_from(self, name: str, source: CopySource, conditions: Conditions = NO_CONDITIONS,
                        tier: str | None = None, copy_tags: bool = False) -> PutResult:
        box = await self._enter("copy_from", name)
        what = f"copy {source.display!r} to {name!r}"
        _, src = _source(source, what)
        if len(src.data) > self.capabilities.copy_max:
            raise ServiceError(f"{what}: HTTP 413 the source is larger than one copy takes", status=413)
        _check(box.objects.get(name), conditions, what)
        headers = replace(src.headers, tier=tier or src.headers.tier, tags=src.headers.tags if copy_tags else {})
        obj = box.objects[name] = _Object(src.data, _etag(), _now(), headers)
        box.staged.pop(name, None)
        box.faults.take("copy_from", name, after=True)
        return PutResult(obj.etag, None)

    async def delete(self, name: str, if_match: str | None = None) -> bool:
        box = await self._enter("delete", name)
        obj = box.objects.get(name)
        if obj is None:
            box.faults.take("delete", name, after=True)
            return False
        _check(obj, Conditions(if_match=if_match), f"delete blob {name!r}")
        del box.objects[name]
        box.staged.pop(name, None)
        box.faults.take("delete", name, after=True)
        return True

    async def delete_many(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        if not self.capabilities.batch_delete_max:
            raise BatchUnsupported("delete_many: this store takes no batches")
        await self._enter("delete_many")
        out: list[bool | ServiceError] = []
        for name, etag in items:
            try:
                out.append(await self.delete(name, etag))
            except ServiceError as exc:
                out.append(exc)
        self.data.faults.take("delete_many", None, after=True)
        return out

    async def close(self) -> None:
        return None


class MemoryWriter:
    """ChunkedWriter of MemoryStore: tokens '<nonce>-<index>'; all staged tokens of an object share a length."""

    def __init__(self, store: MemoryStore, name: str, nonce: str) -> None:
        self.store = store
        self.name = name
        self.nonce = nonce

    def token(self, index: int) -> str:
        return f"{self.nonce}-{index:06d}"

    async def parts(self, *, staged: bool = True) -> Parts:
        box = await self.store._enter("parts", self.name)
        obj = box.objects.get(self.name)
        pending = box.staged.get(self.name, {}) if staged else {}
        result = Parts(obj.parts if obj is not None else (), tuple(Part(t, len(d)) for t, d in pending.items()),
                       obj.etag if obj is not None else None)
        box.faults.take("parts", self.name, after=True)
        return result

    async def stage(self, index: int, data: Buffer, check: PartCheck | None) -> None:
        box = await self.store._enter("stage", self.name)
        body = bytes(data)
        if check is not None and part_check(body, check.kind) != check:
            code = "Crc64Mismatch" if check.kind is BlockCheck.CRC64 else "Md5Mismatch"
            raise CorruptedInTransitError(f"put block of {self.name!r}: HTTP 400 {code}", status=400, code=code)
        self._staged(box, index)[self.token(index)] = body
        box.faults.take("stage", self.name, after=True)

    def _staged(self, box: Container, index: int) -> dict[str, bytes]:
        """The object's staged parts, where part `index` goes: refused while parts of another writer are there."""
        pending = box.staged.setdefault(self.name, {})
        if any(len(t) != len(self.token(index)) for t in pending):
            raise StagingRefusedError(f"put block of {self.name!r}: HTTP 400 InvalidBlobOrBlock", status=400,
                                      code="InvalidBlobOrBlock")
        return pending

    async def stage_from(self, index: int, source: CopySource, offset: int, length: int,
                         check: PartCheck | None = None) -> None:
        box = await self.store._enter("stage_from", self.name)
        _, src = _source(source, f"put block from {source.display!r} to {self.name!r}")
        if offset + length > len(src.data):
            raise ServiceError(f"put block from {source.display!r}: HTTP 416 InvalidRange", status=416)
        if check is not None and part_check(src.data[offset:offset + length], check.kind) != check:
            raise IntegrityError(f"put block from {source.display!r}: the source's bytes differ from the check sent")
        self._staged(box, index)[self.token(index)] = src.data[offset:offset + length]
        box.faults.take("stage_from", self.name, after=True)

    async def commit(self, parts: Sequence[tuple[str, bool]], headers: BlobHeaders,
                     conditions: Conditions = NO_CONDITIONS) -> PutResult:
        box = await self.store._enter("commit", self.name)
        what = f"put block list of {self.name!r}"
        obj = box.objects.get(self.name)
        _check(obj, conditions, what)
        pending = box.staged.get(self.name, {})
        kept = obj.part_data if obj is not None else {}
        chosen: list[tuple[str, bytes]] = []
        for token, from_version in parts:
            body = kept.get(token) if from_version else pending.get(token)
            if body is None:
                raise InvalidBlockListError(f"{what}: HTTP 400 InvalidBlockList: {token!r} is not there",
                                            status=400, code="InvalidBlockList")
            chosen.append((token, body))
        new = _Object(b"".join(b for _, b in chosen), _etag(), _now(), headers,
                      tuple(Part(t, len(b)) for t, b in chosen), dict(chosen))
        box.objects[self.name] = new
        box.staged.pop(self.name, None)
        box.faults.take("commit", self.name, after=True)
        return PutResult(new.etag, None)

    async def clear_stale(self, headers: BlobHeaders, conditions: Conditions) -> str | None:
        box = await self.store._enter("clear_stale", self.name)
        pending = box.staged.get(self.name, {})
        if not any(len(t) != len(self.token(0)) for t in pending):
            return None
        obj = box.objects.get(self.name)
        _check(obj, conditions, f"clear parts of {self.name!r}")
        box.staged.pop(self.name, None)  # as the service's commit of the current version (or of none) drops them
        if obj is None:
            return ""
        obj.etag = _etag()
        return obj.etag

    async def abort(self) -> None:
        box = await self.store._enter("abort", self.name)
        box.staged.pop(self.name, None)


class MemoryBackend:
    def parse(self, url: str) -> MemoryLocation:
        shown = url.split("?", 1)[0]
        parts = urlsplit(url)
        if parts.scheme.lower() != "memory" or not parts.netloc:
            raise UsageError(f"malformed URL {shown!r}: expected memory://<container>[/<path>]")
        if parts.query:
            raise UsageError(f"URL {shown!r}: a memory:// URL takes no query string")
        return MemoryLocation(parts.netloc, unquote(parts.path.lstrip("/")))

    def open(self, location: Location, connection: Connection, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> MemoryStore:
        assert isinstance(location, MemoryLocation)
        no_credential_object(location, credential)
        return MemoryStore(location)

    async def diagnose(self, location: Location, connection: Connection, env: Mapping[str, str], *,
                       write_test: bool, timeout: float) -> Diagnosis:
        raise nothing_to_diagnose(location)


register("memory", MemoryBackend())
