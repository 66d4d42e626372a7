"""The storage seam in the engine's terms: the Store and ChunkedWriter protocols and the plain records they return."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, Self, TypeVar

from blobsync.checksums import BlockCheck as BlockCheck, Buffer as Buffer, PartCheck as PartCheck
from blobsync.config import PLACEHOLDER as PLACEHOLDER
from blobsync.errors import ConflictError, ServiceError

if TYPE_CHECKING:
    from blobsync.errors import ServiceError

T = TypeVar("T")


class Markers:
    """The NextMarkers one listing was given: one that comes again means the listing would never end (a broken or
    hostile service); it is refused with one line instead of listing forever."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: set[int] = set()  # hashes: a marker per page of up to 5,000 names costs a few bytes

    def next(self, marker: str) -> str:
        if marker:
            key = hash(marker)
            if key in self.seen:
                raise ServiceError(f"{self.what}: the service gave the same NextMarker twice, so the listing would "
                                   "never end; refused", code="ListingLoop")
            self.seen.add(key)
        return marker


INVALID_LENGTH = -1  # a listed blob whose length the service sent is not one: its own operation fails, not the listing


@dataclass(frozen=True)
class BlobProperties:
    name: str
    size: int
    etag: str
    last_modified: datetime
    content_md5: bytes | None
    content_type: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    blob_type: str | None = None
    tier: str | None = None
    range_md5: bytes | None = None  # the MD5 the store computed of the range just read, when asked for
    # Headers a reader gets back (Capabilities.properties names: cache_control, content_encoding, ...), when set.
    properties: Mapping[str, str] = field(default_factory=dict)


def listed_blob(name: str, size: int, etag: str, last_modified: datetime, content_md5: bytes | None,
                content_type: str | None, metadata: Mapping[str, str], blob_type: str | None, tier: str | None
                ) -> BlobProperties:
    """BlobProperties as a listing makes one per blob, equal to the dataclass's own: set straight into the new
    instance's fields, as the frozen dataclass's __init__ (a setattr through object per field, ~1 µs) was a tenth
    of what a listed blob costs a sync."""
    props = object.__new__(BlobProperties)
    props.__dict__.update(name=name, size=size, etag=etag, last_modified=last_modified, content_md5=content_md5,
                          content_type=content_type, metadata=metadata, blob_type=blob_type, tier=tier,
                          range_md5=None, properties={})
    return props


@dataclass(frozen=True)
class PutResult:
    etag: str
    content_md5: bytes | None  # what the store computed or stored, when it says
    version_id: str | None = None  # where the account keeps versions (Azure: x-ms-version-id)


@dataclass(frozen=True)
class BlobHeaders:
    """Properties a write sets (they replace the old ones, so they are sent every time)."""

    content_type: str
    content_md5: bytes | None
    metadata: Mapping[str, str]
    tier: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)  # Capabilities.properties name -> value
    tags: Mapping[str, str] = field(default_factory=dict)  # blob index tags


@dataclass(frozen=True)
class Conditions:
    """Optional preconditions for a write: create-only, or only over a known version."""

    if_none_match_any: bool = False
    if_match: str | None = None


NO_CONDITIONS = Conditions()


def check_conditions(etag: str | None, conditions: Conditions, what: str) -> None:
    """Refuse, as the service would, a write whose `conditions` do not hold for the current version (`etag`; None:
    there is none)."""
    if conditions.if_none_match_any and etag is not None:
        raise ConflictError(f"{what}: HTTP 409 BlobAlreadyExists", status=409, code="BlobAlreadyExists")
    if conditions.if_match and etag != conditions.if_match:
        raise ConflictError(f"{what}: HTTP 412 ConditionNotMet", status=412, code="ConditionNotMet")



@dataclass(frozen=True)
class Part:
    """One part of a chunked write: `token` is the store's identity of it (opaque here, journaled as is)."""

    token: str
    size: int


@dataclass(frozen=True)
class Parts:
    """What a store holds of an object's parts: its current version's, in order, and those staged for a commit."""

    committed: tuple[Part, ...]
    staged: tuple[Part, ...]
    etag: str | None  # of the current version, when the store says


@dataclass(frozen=True)
class CopySource:
    """An object another store's service reads itself (a server-side copy): its URL, with whatever authorizes
    the read (a SAS in the query, or `headers`), and the version to read. It carries a secret: it is sent only in
    the copy request the service needs, and never logged, shown or journaled (its repr names the URL only)."""

    url: str = field(repr=False)
    display: str  # the URL without its query: safe to show
    etag: str | None = None  # read only this version (the service refuses the copy if it changed)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # e.g. a bearer token for the source


@dataclass(frozen=True)
class Capabilities:
    """What a store can do beyond the verbs every store has; the engine plans by these."""

    max_parts: int = 50_000  # parts in one committed object
    max_part_size: int = 4000 * 1024 * 1024
    range_md5_max: int = 0  # the largest range whose MD5 the store sends with it (0: it never does)
    spans: bool = False  # read_span(): one read into consecutive pieces (a range over several blocks)
    batch_delete_max: int = 0  # deletes one delete_many request takes (0: delete_many is not offered)
    keeps_parts: bool = False  # a commit may name parts of the current version (delta uploads)
    lists_levels: bool = False  # list_level: one level at a time (a huge listing then runs one prefix per task)
    this_process: bool = False  # its objects live in this process (memory://): no other process reaches them
    lists_from: bool = False  # list_range: a listing may start at any name (a long one is then split by name)
    part_checks: tuple[BlockCheck, ...] = ()  # checks stage() verifies on arrival, the store's preferred first
    copy_max: int = 0  # the largest object copy_from() copies from another store's URL in one request (0: none)
    stage_copy_max: int = 0  # the largest part a writer's stage_from() stages from a URL (0: none)
    copy_sources: bool = False  # copy_source(): this store's objects can be read by another store's service
    writes: bool = True  # False: a source only (put, writer, delete and the copies refuse)
    tags: bool = False  # tags(): the store keeps tags of its own on an object (Azure's blob index tags)
    # What a write may set beyond content type, MD5 and metadata: the store's own write options, each checked
    # against the job's options before anything moves (a flag the destination cannot keep is refused, not dropped).
    tiers: tuple[str, ...] = ()  # the access tiers a write may name
    properties: tuple[str, ...] = ()  # BlobHeaders.properties names it stores and returns (cache_control, ...)
    metadata_name: Callable[[str], bool] | None = None  # the metadata names it keeps (None: any)
    # Its own rules for a write's metadata and tags (UsageError naming the flag): names, characters, how many.
    write_rules: Callable[[Mapping[str, str], Mapping[str, str]], None] | None = None


class Pieces(Protocol):
    """Where one read's body goes piece by piece: consecutive buffers, each handed over as soon as it is full, so
    that a read spanning many blocks holds one or two of them at a time, not all."""

    async def next(self) -> memoryview | None:
        """The buffer the next bytes go into (it may wait for memory; the read pauses meanwhile); None: no more
        are expected."""

    def full(self, view: memoryview) -> None:
        """`view`, the buffer `next` gave last, is full."""


class Location(Protocol):
    """Where a URL points: a container (bucket) and a path in it; `display` and `container_url` hold no secret."""

    @property
    def display(self) -> str: ...

    @property
    def container(self) -> str: ...

    @property
    def container_url(self) -> str: ...

    @property
    def path(self) -> str: ...

    def with_path(self, path: str) -> Self: ...

    def with_sas(self, sas: str) -> Self:
        """The same place signed by `sas`, a SAS given apart from its URL (a resume's: the journal keeps none);
        UsageError when it is not one, or the store takes none."""
        ...


class Requester(Protocol):
    """Runs one request's attempts: the engine passes its request path (limits, retries, counters)."""

    async def __call__(self, attempt: Callable[[], Awaitable[T]]) -> T: ...


async def direct(attempt: Callable[[], Awaitable[T]]) -> T:
    """One try, no retries: the Requester of a caller that retries on its own."""
    return await attempt()


async def each_object(list_page: Callable[[str, str], Awaitable[tuple[list[BlobProperties], str]]], prefix: str,
                      request: Requester = direct) -> AsyncIterator[BlobProperties]:
    """Every object a store's `list_page` gives under `prefix`, page after page, each page one `request`: what a
    store whose listing needs nothing more offers as its list_objects."""
    marker = ""
    while True:
        page, marker = await request(functools.partial(list_page, prefix, marker))
        for props in page:
            yield props
        if not marker:
            return


class ChunkedWriter(Protocol):
    """One chunked write of an object: parts staged by index in any order, then committed once, in order.

    Part identities follow from the write's nonce and the index, so a write resumed (or run twice on two
    machines) stages the same identities. Implementations raise only blobsync.errors exceptions."""

    def token(self, index: int) -> str: ...

    async def parts(self, *, staged: bool = True) -> Parts:
        """The object's committed parts and (with `staged`) the ones staged and not yet committed."""
        ...

    async def stage(self, index: int, data: Buffer, check: PartCheck | None) -> None:
        """Stage part `index`; with `check` (a kind in capabilities.part_checks), the store refuses a body that
        arrives otherwise (a retryable error)."""
        ...

    async def stage_from(self, index: int, source: CopySource, offset: int, length: int,
                         check: PartCheck | None = None) -> None:
        """Stage part `index` as `length` bytes of `source` from `offset`, read by the store's service itself
        (capabilities.stage_copy_max); refused (CopySourceError) when the service cannot read the source, and
        (IntegrityError) when `check` is given and the bytes it read differ from it."""
        ...

    async def commit(self, parts: Sequence[tuple[str, bool]], headers: BlobHeaders,
                     conditions: Conditions = NO_CONDITIONS) -> PutResult:
        """Make the object these parts, in order: (token, kept), kept naming a part of the current version."""
        ...

    async def clear_stale(self, headers: BlobHeaders, conditions: Conditions) -> str | None:
        """Drop parts another writer staged and left (the store refused ours for them: StagingRefusedError),
        keeping the current version as it is, if `conditions` hold for it (else ConflictError, as the commit's).
        Returns the ETag of the version kept ('' where there is none: none is left behind), or None when there was
        nothing to clear. An object a store must make to drop the parts is deleted at once, and carries
        PLACEHOLDER in its metadata meanwhile (a write takes one left by a crash for no object)."""
        ...

    async def abort(self) -> None:
        """Give up the write: parts staged by it need not be kept."""
        ...


class Store(Protocol):
    """Object operations on one container. Implementations raise only blobsync.errors exceptions."""

    capabilities: Capabilities

    @property
    def location(self) -> Location: ...

    @property
    def display_url(self) -> str: ...

    @property
    def container_url(self) -> str:
        """The container's URL without query string (safe to journal)."""
        ...

    def check_name(self, name: str) -> None:
        """Refuse (UnsafeNameError) an object name this store would reject or silently change."""
        ...

    async def create_container(self) -> bool: ...

    async def stat(self, name: str) -> BlobProperties | None: ...

    def list_objects(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                     request: Requester = direct, start: str = "") -> AsyncIterator[BlobProperties]:
        """Every object under `prefix` (named `start` or after it, where capabilities.lists_from), page by page,
        each page one `request`; `expected()` may predict the count (a sync's local file count) so that the store
        can shape its last page."""
        ...

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]:
        """One page of objects under `prefix` from `marker` on, and the marker of the next page ('' after it)."""
        ...

    async def list_level(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], list[str], str]:
        """One page of one level under `prefix` ('/' as the delimiter): its objects, the prefixes one level down
        (each ending in '/'), and the next page's marker. Offered where capabilities.lists_levels."""
        ...

    async def list_range(self, prefix: str, start: str, marker: str = "", size: int | None = None
                         ) -> tuple[list[BlobProperties], str]:
        """One page of objects under `prefix` named `start` or after it (in the store's order), from `marker` on
        (up to `size`), and the next page's marker. Offered where capabilities.lists_from."""
        ...

    async def read_into(self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *,
                        range_md5: bool = False) -> BlobProperties:
        """Read len(buf) bytes from `offset` into `buf`, with the properties as of that read; `range_md5` asks
        for the range's MD5 (ranges up to capabilities.range_md5_max only)."""
        ...

    async def read_span(self, name: str, offset: int, length: int, pieces: Pieces,
                        if_match: str | None = None) -> BlobProperties:
        """Read `length` bytes from `offset` in one request into `pieces` (capabilities.spans), with the properties
        as of that read. A short body is a retryable NetworkError (the pieces already full stay full)."""
        ...

    async def read_first(self, name: str, buf: memoryview) -> tuple[BlobProperties, int]:
        """The object's properties and its first bytes, up to len(buf), in one request (a small object whole,
        with no HEAD before it); how many bytes were read."""
        ...

    async def put(self, name: str, data: Buffer, headers: BlobHeaders,
                  conditions: Conditions = NO_CONDITIONS) -> PutResult: ...

    def writer(self, name: str, nonce: str) -> ChunkedWriter: ...

    async def copy_source(self, name: str, etag: str | None, reader: Location) -> CopySource:
        """The object `name` (version `etag`) as the service of the store at `reader` may read it
        (capabilities.copy_sources): its URL with a read authorization (the URL's SAS, a short read SAS signed with
        an account key, a token). A credential that may not go to the reader's host is a UsageError, not sent."""
        ...

    async def copy_from(self, name: str, source: CopySource, conditions: Conditions = NO_CONDITIONS,
                        tier: str | None = None, copy_tags: bool = False) -> PutResult:
        """Write `name` as a copy of `source` with its properties and metadata (and, with `copy_tags`, its tags),
        read by this store's service (objects up to capabilities.copy_max), in access `tier` if given. Refused
        (CopySourceError) when the service cannot read the source."""
        ...

    async def tags(self, name: str) -> Mapping[str, str]:
        """The object's tags (capabilities.tags)."""
        ...

    async def delete(self, name: str, if_match: str | None = None) -> bool:
        """Delete an object (with its snapshots); False when it was gone already."""
        ...

    async def delete_many(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        """Many deletes in one request: per object True (deleted), False (gone) or its error; raises
        BatchUnsupported where the service has none (then the caller deletes one by one)."""
        ...

    async def close(self) -> None: ...
