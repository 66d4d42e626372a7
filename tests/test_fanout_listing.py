"""A listing fanned out by folder gives what one flat listing gives (issue 52): on Azurite and in memory, names
with every awkward character included, at every depth, with levels too wide to fan out listed flat, and with
excluded folders never listed."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from blobsync.backends import memory
from blobsync.backends.base import BlobHeaders, Store, direct
from blobsync.backends.registry import open_store
from blobsync.config import TransferConfig
from blobsync.engine import listing, name_ranges
from blobsync.engine.listing import RemoteLister
from blobsync.errors import ServiceError
from blobsync.filters import Filters
from blobsync.journal.index import SyncIndex

ROOT = "data/"
# Every kind of name a listing has to carry through a delimiter and a marker: XML's own characters, percent and
# plus signs, non-ASCII, doubled and trailing slashes, names sharing a folder's name as a prefix ('a/b' beside
# 'a/b/c' and 'a/bc'), a folder marker, dots, and a level of more folders than the test's fan-out limit.
NAMES = [
    "top.bin", "a&b<c>'\"q.txt", "sp ace/file one.txt", "sp ace/file%20two.txt", "plus+sign/x+y.bin",
    "naïve-ünïcødé/日本語.txt", "emoji/🙂.bin", "dbl//slash.txt", "dbl//deeper//x.bin", "a/b", "a/b/c", "a/bc",
    "a/b/c/d/e/f/g.bin", "dots/.hidden", "dots/..x", "hash#/q?.txt", "marker/", "marker/in.bin",
    "back\\slash/x.txt", "tab\tname/x.txt", "skip/me.bin", "skip/deep/me.bin", "skipped-not.bin",
    *(f"wide/w{i:02d}/f.bin" for i in range(7)),
]


def _holding(request: pytest.FixtureRequest, names: list[str], tag: str) -> Iterator[str]:
    """The URL of a container (in memory or on Azurite, by the fixture's param) holding `names`, each blob's bytes
    its name, written independently of the listing under test."""
    if request.param == "memory":
        name = f"{tag}-{uuid.uuid4().hex[:12]}"
        memory.container(name)
        url = f"memory://{name}"

        async def fill() -> None:
            store = open_store(url, TransferConfig(), os.environ)
            try:
                for blob in names:
                    await store.put(blob, blob.encode(), BlobHeaders("application/octet-stream", None, {}))
            finally:
                await store.close()

        asyncio.run(fill())
        yield url
        memory.drop(name)
        return
    container = request.getfixturevalue("container")
    for blob in names:
        container.client.upload_blob(blob, blob.encode())
    yield container.url


@pytest.fixture(params=["memory", "azurite"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a container holding NAMES under ROOT (and one blob outside it)."""
    yield from _holding(request, [ROOT + n for n in NAMES] + ["data-not-under-root.bin", "data"], "fan")


def _listed(url: str, how: str, filters: Filters, prefixes: list[str] | None = None) -> list[tuple[Any, ...]]:
    async def run() -> list[tuple[Any, ...]]:
        store: Store = open_store(url, TransferConfig(), os.environ)
        index = SyncIndex()
        try:
            if prefixes is not None:
                _spy(store, prefixes)
            lister = RemoteLister(store, direct, ROOT, index, "src", filters, lambda props, entry: 0.0)
            await (lister.under(ROOT) if how == "flat" else lister.fan_out())
            return [(e.rel, e.size, e.etag, e.md5, e.name) for e in index.entries("src")]
        finally:
            index.close()
            await store.close()

    return asyncio.run(run())


def _spy(store: Store, prefixes: list[str]) -> None:
    """Record the prefix of every listing request."""
    flat, level, ranged = store.list_objects, store.list_level, store.list_range

    def list_objects(prefix: str = "", **kwargs: Any) -> Any:
        prefixes.append("flat:" + prefix)
        return flat(prefix, **kwargs)

    async def list_level(prefix: str = "", marker: str = "") -> Any:
        prefixes.append(prefix)
        return await level(prefix, marker)

    async def list_range(prefix: str, start: str, marker: str = "", size: int | None = None) -> Any:
        prefixes.append("flat:" + prefix)
        return await ranged(prefix, start, marker, size)

    store.list_objects = list_objects  # type: ignore[method-assign]
    store.list_level = list_level  # type: ignore[method-assign]
    store.list_range = list_range  # type: ignore[method-assign]


@pytest.mark.parametrize("limits", [(4, 5000), (1000, 5000), (1000, 3)], ids=["wide", "deep", "too-wide-goes-flat"])
def test_a_fanned_out_listing_gives_what_a_flat_one_gives(store_url: str, limits: tuple[int, int],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    descend_below, fanout_max = limits
    monkeypatch.setattr(listing, "DESCEND_BELOW", descend_below)
    monkeypatch.setattr(listing, "LISTINGS_IN_FLIGHT", 3)
    monkeypatch.setattr(listing, "FANOUT_MAX", fanout_max)
    flat = _listed(store_url, "flat", Filters())
    prefixes: list[str] = []
    fanned = _listed(store_url, "fan", Filters(), prefixes)
    assert fanned == flat
    assert len(flat) == len(NAMES) - 1  # the folder marker is no file
    assert len(prefixes) > 1  # it did fan out


@pytest.mark.parametrize("page", [5000, 3], ids=["short-levels", "long-levels"])
def test_an_excluded_folder_is_never_listed(store_url: str, page: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not even where a level is longer than a page, which is otherwise listed flat (and split by name)."""
    from blobsync.backends.azure.store import AzureContainerStore

    monkeypatch.setattr(AzureContainerStore, "page_size", page)
    monkeypatch.setattr(memory.MemoryStore, "page_size", page)
    filters = Filters.parse(exclude_path="skip/;a/b/c;dbl/")
    prefixes: list[str] = []
    fanned = _listed(store_url, "fan", filters, prefixes)
    assert fanned == _listed(store_url, "flat", filters)
    assert {rel for rel, *_ in fanned} >= {"skipped-not.bin", "a/b", "a/bc"}
    excluded = (ROOT + "skip/", ROOT + "a/b/c", ROOT + "dbl/")
    assert not any(p.removeprefix("flat:").startswith(excluded) for p in prefixes), prefixes
    # Nor is any folder holding an excluded one listed flat (that would list the excluded one too).
    assert not any(x.startswith(p.removeprefix("flat:")) for p in prefixes if p.startswith("flat:") for x in excluded)
    assert not any(rel.startswith("dbl/") for rel, *_ in fanned)


@pytest.mark.parametrize("answer", ["data/", "elsewhere/", "data/x"], ids=["itself", "outside", "no-slash"])
def test_a_folder_the_service_lists_outside_the_one_asked_for_stops_the_listing(answer: str) -> None:
    """A buggy or hostile service answering a level with the folder itself would have the fan-out list it again
    forever; one outside it, list what was not asked for. Either is a one-line error, never a loop."""
    name = f"fan-{uuid.uuid4().hex[:12]}"
    memory.container(name)

    async def run() -> None:
        store: Store = open_store(f"memory://{name}", TransferConfig(), os.environ)
        index = SyncIndex()

        async def list_level(prefix: str = "", marker: str = "") -> Any:
            return [], [answer], ""

        store.list_level = list_level  # type: ignore[method-assign]
        try:
            lister = RemoteLister(store, direct, ROOT, index, "src", Filters(), lambda props, entry: 0.0)
            with pytest.raises(ServiceError, match="not below"):
                await asyncio.wait_for(lister.fan_out(), 10)
        finally:
            index.close()
            await store.close()
            memory.drop(name)

    asyncio.run(run())


# A flat namespace (no folders under ROOT's 'flat/'): counters, then names that part from them early and late, and
# every awkward character the suite knows, listed in pages of 7 so that a split has something to split.
FLAT = [f"obj-{i:06d}.bin" for i in range(300)] + [n.replace("/", "_") for n in NAMES if "\\" not in n] + [
    "obj-000299.bin.more", "zz-last", "Zebra", "~tilde", "9-nine", "ü-umlaut", "🙂-late"]


@pytest.fixture(params=["memory", "azurite"])
def flat_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _holding(request, [ROOT + "flat/" + n for n in FLAT] + [ROOT + "flat", ROOT + "flatter/x"], "rng")


def _ranged(url: str, ranges: int, probe: Any = None, pages: Any = None
            ) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The listing of ROOT + 'flat/' in up to `ranges` ranges (`probe` and `pages` wrap the store's list_range and
    list_objects), and the name each range started at."""
    started: list[str] = []

    async def run() -> list[tuple[Any, ...]]:
        store: Store = open_store(url, TransferConfig(), os.environ)
        store.page_size = 7  # type: ignore[attr-defined]
        if probe:
            store.list_range = probe(store.list_range)  # type: ignore[method-assign]
        real = pages(store.list_objects) if pages else store.list_objects

        def list_objects(prefix: str = "", **kwargs: Any) -> Any:
            started.append(kwargs.get("start", ""))
            return real(prefix, **kwargs)

        store.list_objects = list_objects  # type: ignore[method-assign]
        index = SyncIndex()
        try:
            lister = RemoteLister(store, direct, ROOT, index, "src", Filters(), lambda props, entry: 0.0)
            await lister.under(ROOT + "flat/", ranges=ranges)
            return [(e.rel, e.size, e.etag, e.md5, e.name) for e in index.entries("src")]
        finally:
            index.close()
            await store.close()

    return asyncio.run(run()), started


@pytest.fixture(autouse=True)
def _split_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(name_ranges, "SPLIT_AFTER", 7)  # a range tries to split after a page of 7


def test_a_long_flat_listing_split_by_name_gives_what_one_listing_gives(flat_url: str) -> None:
    one, _ = _ranged(flat_url, 1)
    split, started = _ranged(flat_url, 8)
    assert split == one
    assert sorted(rel for rel, *_ in one) == sorted("flat/" + n for n in FLAT)
    assert started[0] == "" and 4 <= len(started) <= 8 and len(set(started)) == len(started)  # ranges, split


def test_a_range_that_never_meets_its_end_goes_on_and_misses_nothing(flat_url: str) -> None:
    """A service ordering names otherwise than the probes assumed (or a blob deleted meanwhile): the range before
    it never sees the name it ends at, lists on to the end, and the index keeps one entry per name."""
    one, _ = _ranged(flat_url, 1)
    starts: set[str] = set()

    def pages(real: Any) -> Any:
        def list_objects(prefix: str = "", **kwargs: Any) -> Any:
            own = kwargs.get("start", "")
            starts.add(own)

            async def each() -> Any:
                async for props in real(prefix, **kwargs):
                    if props.name not in starts or props.name == own:
                        yield props  # a range never meets the name another one starts at
            return each()
        return list_objects

    split, started = _ranged(flat_url, 8, pages=pages)
    assert len(started) > 1 and split == one


def test_a_service_that_takes_no_start_lists_in_one_range(flat_url: str) -> None:
    def probe(real: Any) -> Any:
        async def list_range(prefix: str, start: str, marker: str = "", size: int | None = None) -> Any:
            raise ServiceError("the value for one of the HTTP headers is not in the correct format",
                               status=400, code="InvalidHeaderValue")
        return list_range

    one, _ = _ranged(flat_url, 1)
    split, started = _ranged(flat_url, 8, probe)
    assert split == one and started == [""]


@pytest.mark.parametrize("how", ["flat", "fan"])
def test_a_blob_the_service_lists_outside_the_root_stops_the_listing(how: str) -> None:
    """Its name cut by the root's length would be another file's (a hostile service could rename entries that way):
    a one-line error, and nothing of the listing is used."""
    name = f"out-{uuid.uuid4().hex[:12]}"
    memory.container(name)

    async def run() -> None:
        store: Store = open_store(f"memory://{name}", TransferConfig(), os.environ)
        for blob in (ROOT + "a.bin", ROOT + "b/c.bin"):
            await store.put(blob, b"x", BlobHeaders("application/octet-stream", None, {}))
        page, level, objects = store.list_page, store.list_level, store.list_objects
        outside = (await store.stat(ROOT + "a.bin"))
        assert outside is not None
        stranger = dataclasses.replace(outside, name="dat/evil.bin")

        async def list_page(prefix: str = "", marker: str = "") -> Any:
            found, more = await page(prefix, marker)
            return [*found, stranger], more

        async def list_level(prefix: str = "", marker: str = "") -> Any:
            found, below, more = await level(prefix, marker)
            return [*found, stranger], below, more

        def list_objects(prefix: str = "", **kwargs: Any) -> Any:
            async def each() -> Any:
                async for props in objects(prefix, **kwargs):
                    yield props
                yield stranger
            return each()

        store.list_page = list_page  # type: ignore[method-assign]
        store.list_level = list_level  # type: ignore[method-assign]
        store.list_objects = list_objects  # type: ignore[method-assign]
        index = SyncIndex()
        try:
            lister = RemoteLister(store, direct, ROOT, index, "src", Filters(), lambda props, entry: 0.0)
            with pytest.raises(ServiceError, match="not under"):
                await (lister.under(ROOT) if how == "flat" else lister.fan_out())
        finally:
            index.close()
            await store.close()
            memory.drop(name)

    asyncio.run(run())


def test_a_range_that_fails_fails_the_listing_as_its_own_error(flat_url: str) -> None:
    """A page of a later range failing (past its retries) stops every range and raises that error itself, never an
    ExceptionGroup, and never a listing that looks complete: a sync then deletes nothing and exits non-zero."""
    def pages(real: Any) -> Any:
        def list_objects(prefix: str = "", **kwargs: Any) -> Any:
            async def each() -> Any:
                async for props in real(prefix, **kwargs):
                    yield props
                if kwargs.get("start"):
                    raise ServiceError("list blobs: HTTP 503 ServerBusy", status=503, code="ServerBusy")
            return each()
        return list_objects

    with pytest.raises(ServiceError, match="ServerBusy"):
        _ranged(flat_url, 8, pages=pages)
