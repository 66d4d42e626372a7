"""A listing fanned out by folder gives what one flat listing gives (issue 52): on Azurite and in memory, names
with every awkward character included, at every depth, with levels too wide to fan out listed flat, and with
excluded folders never listed."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from blobsync.backends import memory
from blobsync.backends.base import BlobHeaders, Store, direct
from blobsync.backends.registry import open_store
from blobsync.config import TransferConfig
from blobsync.engine import listing
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


@pytest.fixture(params=["memory", "azurite"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a container holding NAMES under ROOT (and one blob outside it), written independently."""
    names = [ROOT + n for n in NAMES] + ["data-not-under-root.bin", "data"]
    if request.param == "memory":
        name = f"fan-{uuid.uuid4().hex[:12]}"
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
    for name in names:
        container.client.upload_blob(name, name.encode())
    yield container.url


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
    flat, level = store.list_objects, store.list_level

    def list_objects(prefix: str = "", **kwargs: Any) -> Any:
        prefixes.append("flat:" + prefix)
        return flat(prefix, **kwargs)

    async def list_level(prefix: str = "", marker: str = "") -> Any:
        prefixes.append(prefix)
        return await level(prefix, marker)

    store.list_objects = list_objects  # type: ignore[method-assign]
    store.list_level = list_level  # type: ignore[method-assign]


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


def test_an_excluded_folder_is_never_listed(store_url: str) -> None:
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
