"""The storage interface the engine depends on (a Protocol), and the plain records it returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from blobsync.errors import ServiceError

T = TypeVar("T")


class BlockState(Enum):
    """Which list Put Block List resolves a block ID in."""

    COMMITTED = "Committed"
    UNCOMMITTED = "Uncommitted"
    LATEST = "Latest"


@dataclass(frozen=True)
class Block:
    block_id: str  # base64 text, as sent on the wire
    size: int


@dataclass(frozen=True)
class BlockList:
    committed: tuple[Block, ...]
    uncommitted: tuple[Block, ...]
    blob_length: int | None  # None when the blob has no committed version
    etag: str | None


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
    range_md5: bytes | None = None  # the MD5 the service computed of the range just read, when asked for


@dataclass(frozen=True)
class PutResult:
    etag: str
    content_md5: bytes | None  # what the service computed or stored, when it says


@dataclass(frozen=True)
class BlobHeaders:
    """Properties that Put Blob and Put Block List set (they replace, so we send them every time)."""

    content_type: str
    content_md5: bytes | None
    metadata: Mapping[str, str]
    tier: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)  # header name -> value: x-ms-blob-cache-control..
    tags: Mapping[str, str] = field(default_factory=dict)  # blob index tags


@dataclass(frozen=True)
class Conditions:
    """Optional preconditions for a write: create-only, or only over a known version."""

    if_none_match_any: bool = False
    if_match: str | None = None


NO_CONDITIONS = Conditions()

BATCH_MAX = 256  # deletes in one delete_blobs call (the Blob Batch limit)
RANGE_MD5_MAX = 4 * 1024 * 1024  # the largest range the service computes an MD5 of on the fly


class Requester(Protocol):
    """Runs one request's attempts: the engine passes its request path (limits, retries, counters)."""

    async def __call__(self, attempt: Callable[[], Awaitable[T]]) -> T: ...


async def direct(attempt: Callable[[], Awaitable[T]]) -> T:
    """One try, no retries: the Requester of a caller that retries on its own."""
    return await attempt()

Buffer = bytes | bytearray | memoryview


class ContainerStore(Protocol):
    """Blob operations on one container. Implementations raise only blobsync.errors exceptions."""

    @property
    def display_url(self) -> str: ...

    @property
    def container_url(self) -> str:
        """The container's URL without query string (safe to journal)."""
        ...

    async def create_container(self) -> bool: ...

    async def get_properties(self, name: str) -> BlobProperties | None: ...

    async def put_blob(
        self, name: str, data: Buffer, headers: BlobHeaders, conditions: Conditions = NO_CONDITIONS
    ) -> PutResult: ...

    async def put_block(self, name: str, block_id: str, data: Buffer, content_md5: bytes | None) -> None: ...

    async def put_block_list(
        self,
        name: str,
        blocks: Sequence[tuple[str, BlockState]],
        headers: BlobHeaders,
        conditions: Conditions = NO_CONDITIONS,
    ) -> PutResult: ...

    async def get_block_list(self, name: str, which: str = "all") -> BlockList: ...

    async def get_range(
        self, name: str, offset: int, length: int | None, if_match: str | None = None
    ) -> tuple[list[bytes], BlobProperties]: ...

    async def get_range_into(
        self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *, range_md5: bool = False
    ) -> BlobProperties:
        """`range_md5`: ask the service for the range's MD5 (ranges up to RANGE_MD5_MAX only)."""
        ...

    def list_blobs(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                   request: Requester = direct) -> AsyncIterator[BlobProperties]: ...

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]: ...

    async def delete_blob(self, name: str, if_match: str | None = None) -> bool: ...

    async def delete_blobs(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        """Many deletes in one request: per blob True (deleted), False (gone) or its error; raises
        BatchUnsupported where the service has no batches."""
        ...

    async def close(self) -> None: ...
