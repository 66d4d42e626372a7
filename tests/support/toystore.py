"""A store written outside blobsync, the way a new backend would be: objects as files in a local folder, staged
parts beside them. It registers the scheme toy:// and offers none of the optional capabilities (no batch
deletes, no range MD5, no parts kept across versions), which the engine must then do without."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Self
from urllib.parse import quote, unquote, urlsplit

from blobsync.backends.base import (
    NO_CONDITIONS,
    BlobHeaders,
    BlobProperties,
    Buffer,
    Capabilities,
    Conditions,
    Location,
    Part,
    PartCheck,
    Parts,
    PutResult,
    Requester,
    direct,
)
from blobsync.backends.registry import Connection, Wire, register
from blobsync.errors import (
    BatchUnsupported,
    BlobNotFoundError,
    ConflictError,
    CorruptedInTransitError,
    InvalidBlockListError,
    ServiceError,
    UnsafeNameError,
    UsageError,
)

ROOTS: dict[str, Path] = {}  # box name -> folder holding it (set by the test)


@dataclass(frozen=True)
class ToyLocation:
    container: str
    path: str

    @property
    def container_url(self) -> str:
        return f"toy://{self.container}"

    @property
    def display(self) -> str:
        return f"{self.container_url}/{quote(self.path)}" if self.path else self.container_url

    def with_path(self, path: str) -> Self:
        return replace(self, path=path)


def _key(name: str) -> str:
    return quote(name, safe="")


class ToyStore:
    capabilities = Capabilities()
    page_size = 100

    def __init__(self, location: ToyLocation) -> None:
        self._loc = location
        self.root = ROOTS[location.container]
        self.calls: dict[str, int] = {}

    @property
    def location(self) -> ToyLocation:
        return self._loc

    @property
    def display_url(self) -> str:
        return self._loc.display

    @property
    def container_url(self) -> str:
        return self._loc.container_url

    def check_name(self, name: str) -> None:
        if not name or name.endswith("/"):
            raise UnsafeNameError(f"{name!r}: not a toy name")

    def _meta(self, name: str) -> dict[str, object] | None:
        path = self.root / (_key(name) + ".json")
        return json.loads(path.read_text()) if path.exists() else None

    async def create_container(self) -> bool:
        return False

    async def stat(self, name: str) -> BlobProperties | None:
        await asyncio.sleep(0)
        meta = self._meta(name)
        if meta is None:
            return None
        md5 = meta["md5"]
        return BlobProperties(name, int(str(meta["size"])), str(meta["etag"]), datetime.fromtimestamp(
            float(str(meta["mtime"])), UTC), bytes.fromhex(str(md5)) if md5 else None, str(meta["type"]),
            dict(meta["metadata"]))

    def list_objects(self, prefix: str = "", *, expected: Callable[[], int | None] | None = None,
                     request: Requester = direct, start: str = "") -> AsyncIterator[BlobProperties]:
        async def pages() -> AsyncIterator[BlobProperties]:
            marker = ""
            while True:
                page, marker = await request(lambda m=marker: self.list_page(prefix, m))
                for props in page:
                    yield props
                if not marker:
                    return

        return pages()

    async def list_page(self, prefix: str = "", marker: str = "") -> tuple[list[BlobProperties], str]:
        names = sorted(n for n in (unquote(p.name[:-5]) for p in self.root.glob("*.json"))
                       if n.startswith(prefix) and n > marker)
        page = [p for p in [await self.stat(n) for n in names[:self.page_size]] if p is not None]
        return page, names[self.page_size - 1] if len(names) > self.page_size else ""

    async def read_into(self, name: str, offset: int, buf: memoryview, if_match: str | None = None, *,
                        range_md5: bool = False) -> BlobProperties:
        props = await self.stat(name)
        if props is None:
            raise BlobNotFoundError(f"{name!r} not found")
        if if_match and props.etag != if_match:
            raise ConflictError(f"{name!r} changed", code="ConditionNotMet")
        with open(self.root / _key(name), "rb") as f:
            f.seek(offset)
            data = f.read(len(buf))
        buf[:len(data)] = data
        if len(data) != len(buf):
            raise ServiceError(f"{name!r}: range beyond the end")
        return props

    async def read_first(self, name: str, buf: memoryview) -> tuple[BlobProperties, int]:
        props = await self.stat(name)
        if props is None:
            raise BlobNotFoundError(f"{name!r} not found")
        with open(self.root / _key(name), "rb") as f:
            data = f.read(len(buf))
        buf[:len(data)] = data
        return props, len(data)

    def _write(self, name: str, data: bytes, headers: BlobHeaders, conditions: Conditions) -> PutResult:
        current = self._meta(name)
        if conditions.if_none_match_any and current is not None:
            raise ConflictError(f"{name!r} exists", code="BlobAlreadyExists")
        if conditions.if_match and (current is None or current["etag"] != conditions.if_match):
            raise ConflictError(f"{name!r} changed", code="ConditionNotMet")
        etag = hashlib.sha1(os.urandom(8)).hexdigest()
        (self.root / _key(name)).write_bytes(data)
        md5 = headers.content_md5
        (self.root / (_key(name) + ".json")).write_text(json.dumps({
            "size": len(data), "etag": etag, "mtime": datetime.now(UTC).timestamp(), "md5": md5.hex() if md5 else None,
            "type": headers.content_type, "metadata": dict(headers.metadata)}))
        return PutResult(etag, None)

    async def put(self, name: str, data: Buffer, headers: BlobHeaders,
                  conditions: Conditions = NO_CONDITIONS) -> PutResult:
        self.calls["put"] = self.calls.get("put", 0) + 1
        body = bytes(data)
        if headers.content_md5 is not None and hashlib.md5(body).digest() != headers.content_md5:
            raise CorruptedInTransitError(f"{name!r}: damaged body")
        return self._write(name, body, headers, conditions)

    def writer(self, name: str, nonce: str) -> ToyWriter:
        return ToyWriter(self, name, nonce)

    async def delete(self, name: str, if_match: str | None = None) -> bool:
        meta = self._meta(name)
        if meta is None:
            return False
        if if_match and meta["etag"] != if_match:
            raise ConflictError(f"{name!r} changed", code="ConditionNotMet")
        (self.root / _key(name)).unlink()
        (self.root / (_key(name) + ".json")).unlink()
        return True

    async def delete_many(self, items: Sequence[tuple[str, str | None]]) -> list[bool | ServiceError]:
        raise BatchUnsupported("no batches in a toy")

    async def close(self) -> None:
        return None


class ToyWriter:
    def __init__(self, store: ToyStore, name: str, nonce: str) -> None:
        self.store = store
        self.name = name
        self.nonce = nonce
        self.staging = store.root / ".staged" / _key(name)

    def token(self, index: int) -> str:
        return f"{self.nonce}.{index:06d}"

    async def parts(self, *, staged: bool = True) -> Parts:
        meta = self.store._meta(self.name)
        committed = tuple(Part(t, s) for t, s in meta.get("parts", [])) if meta else ()
        pending = tuple(Part(p.name, p.stat().st_size) for p in sorted(self.staging.glob("*"))) if staged and \
            self.staging.exists() else ()
        return Parts(committed, pending, str(meta["etag"]) if meta else None)

    async def stage(self, index: int, data: Buffer, check: PartCheck | None) -> None:
        self.store.calls["stage"] = self.store.calls.get("stage", 0) + 1
        body = bytes(data)
        assert check is None, "this store verifies no part check, so it is sent none"
        self.staging.mkdir(parents=True, exist_ok=True)
        (self.staging / self.token(index)).write_bytes(body)

    async def commit(self, parts: Sequence[tuple[str, bool]], headers: BlobHeaders,
                     conditions: Conditions = NO_CONDITIONS) -> PutResult:
        chunks = []
        for token, kept in parts:
            path = self.staging / token
            if kept or not path.exists():
                raise InvalidBlockListError(f"{self.name!r}: part {token} is not staged")
            chunks.append(path.read_bytes())
        result = self.store._write(self.name, b"".join(chunks), headers, conditions)
        meta_path = self.store.root / (_key(self.name) + ".json")
        meta = json.loads(meta_path.read_text())
        meta["parts"] = [[t, len(c)] for (t, _), c in zip(parts, chunks, strict=True)]
        meta_path.write_text(json.dumps(meta))
        for path in self.staging.glob("*"):
            path.unlink()
        return result

    async def clear_stale(self, headers: BlobHeaders, conditions: Conditions) -> str | None:
        return None

    async def abort(self) -> None:
        for path in self.staging.glob("*"):
            path.unlink()


class ToyBackend:
    def parse(self, url: str) -> Location:
        parts = urlsplit(url)
        if parts.scheme != "toy" or parts.netloc not in ROOTS:
            raise UsageError(f"no toy box at {url!r}")
        return ToyLocation(parts.netloc, unquote(parts.path.lstrip("/")))

    def open(self, location: Location, connection: Connection, env: Mapping[str, str], wire: Wire,
             credential: object = None) -> ToyStore:
        assert isinstance(location, ToyLocation)
        return ToyStore(location)


register("toy", ToyBackend())
