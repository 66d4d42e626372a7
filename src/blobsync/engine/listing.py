"""Listings: into the scratch index (millions are kept in SQLite, not in memory), blobs as index entries and back,
and the blobs a URL names page by page (ls, rm)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from blobsync.backends.base import BlobProperties, Markers, Requester, Store
from blobsync.config import CRC64_METADATA
from blobsync.engine.digest import crc64_text, stored_crc64
from blobsync.engine.mtime import MTIME_KEY, format_mtime, parse_mtime
from blobsync.engine.name_ranges import budget, list_in_ranges
from blobsync.engine.tasks import for_each
from blobsync.errors import BlobNotFoundError, ServiceError, UsageError
from blobsync.filters import Filters
from blobsync.journal.index import Entry, SyncIndex
from blobsync.naming import folder_prefix, relative_name
from blobsync.redact import printable


def is_folder_marker(props: BlobProperties) -> bool:
    """A blob that stands for a folder, not a file: a name ending in '/', or a Data Lake / hierarchical-namespace
    stub (metadata hdi_isfolder=true, as AzCopy skips them by default). Never downloaded, never compared."""
    if props.name.endswith("/"):
        return True
    for key, value in props.metadata.items():  # a loop, not any(): a sync asks of every listed blob
        if len(key) == 12 and key.lower() == "hdi_isfolder" and value.lower() == "true":
            return True
    return False


def remote_entry(prefix: str, props: BlobProperties) -> Entry:
    """A listed blob under `prefix` as an index entry: its relative name, size, mtime (the stored one if any)."""
    metadata = props.metadata
    stored = metadata.get(MTIME_KEY)
    mtime = parse_mtime(stored) if stored else None
    exact = mtime is not None
    if mtime is None:
        mtime = int(props.last_modified.timestamp()) * 1_000_000_000
    # Most blobs have only the mtime: stored_crc64 looks through the metadata only where there is more.
    crc64 = stored_crc64(metadata, props.content_md5) if len(metadata) > exact else None
    return Entry(relative_name(prefix, props.name), props.size, mtime, exact, props.content_md5, props.etag, props.name,
                 0, props.tier, crc64)


def as_properties(entry: Entry) -> BlobProperties:
    """Enough of a blob's properties for the downloader, rebuilt from the listing entry."""
    metadata = {MTIME_KEY: format_mtime(entry.mtime_ns)} if entry.exact_mtime else {}
    if entry.crc64 is not None:
        metadata[CRC64_METADATA] = crc64_text(entry.crc64, entry.md5)
    return BlobProperties(entry.name or entry.rel, entry.size, entry.etag or "",
                          datetime.fromtimestamp(entry.mtime_ns / 1e9, UTC), entry.md5, None, metadata,
                          tier=entry.tier)


def entry_time(props: BlobProperties, entry: Entry) -> float:
    """The time a listed blob's filters compare (--include-after/before): its stored mtime, else Last-Modified."""
    return entry.mtime_ns / 1e9


LISTINGS_IN_FLIGHT = 16  # prefixes listed at once when a listing fans out (rclone lists 16 folders at once too)
DESCEND_BELOW = 4  # a level is listed with a delimiter only while fewer folders than this are known: a delimiter
#                    listing of a folder costs the service a scan of all below it (Azurite: as much as listing it
#                    flat), so 4 folders listed flat side by side beat listing each level again
FANOUT_MAX = 5000  # folders found at one level beyond which the level is listed flat (a request per folder then
#                    costs more than a page of 5,000 of them: 10^5 folders of 10 blobs are 20 pages flat)


class RemoteLister:
    """Lists what is under a root prefix into one side of a scratch index, page by page (memory stays flat
    however many objects): all at once, or fanned out a folder per task where the store lists levels."""

    def __init__(self, store: Store, request: Requester, root: str, index: SyncIndex, side: str, filters: Filters,
                 when: Callable[[BlobProperties, Entry], float], seen: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.request = request
        self.root = root  # entries are named relative to it
        self.index = index
        self.side = side
        self.filters = filters
        self.when = when  # the time the filters' --include-after/before compare
        self.seen = seen or (lambda count: None)  # told of each page's objects, for progress during enumeration
        self.listed = 0  # objects seen (folder markers aside), whether the filters took them or not
        self._told = 0  # of them, how many `seen` was told of

    async def listing(self, flat_in: Callable[[RemoteLister, list[str]], Awaitable[None]] | None = None) -> None:
        """Every object under the root, fanned out where the store lists levels, else one listing."""
        if self.store.capabilities.lists_levels:
            await self.fan_out(flat_in)
        else:
            await self.under(self.root)

    async def under(self, prefix: str, expected: Callable[[], int | None] | None = None, *, ranges: int = 1) -> None:
        """Every object under `prefix`; batches of 1,000 leave little to insert after the last page. Each page is
        retried on its own; one that keeps failing stops the listing (and with it any delete). Where the store
        lists from any name, a listing longer than a page is split by name into up to `ranges` listings."""
        if ranges > 1 and self.store.capabilities.lists_from:
            await list_in_ranges(self, prefix, ranges, expected)
            return
        batch: list[Entry] = []
        async for props in self.store.list_objects(prefix, expected=expected, request=self.request):
            self.take(props, batch)
            if len(batch) >= 1000:
                self.add(batch)
                batch = []
        self.add(batch)

    async def fan_out(self, flat_in: Callable[[RemoteLister, list[str]], Awaitable[None]] | None = None) -> None:
        """Every object under the root, up to LISTINGS_IN_FLIGHT listings at once: levels are listed with a
        delimiter (their blobs go into the index as they come) until a few folders are known (DESCEND_BELOW),
        then each folder is listed flat (by `flat_in`, if given: a process of its own). A serial listing of 10^8
        objects is 20,000 round trips, hours; excluded folders (--exclude-path, a non-recursive sync) are never
        listed."""
        frontier, flat = [self.root], []
        while frontier:
            if len(frontier) >= DESCEND_BELOW:  # enough to list flat, but for folders holding an excluded one
                flat += [p for p in frontier if not self._excludes_below(p)]
                frontier = [p for p in frontier if self._excludes_below(p)]
            if frontier:
                frontier, too_wide = await self._levels(frontier)
                flat += too_wide
        if flat and flat_in is not None:
            await flat_in(self, flat)
        else:
            await self.flat(flat)

    async def flat(self, prefixes: list[str]) -> None:
        """Every object under each of `prefixes`, LISTINGS_IN_FLIGHT listings at once: each prefix listed flat,
        split by name where there are fewer prefixes than that."""
        ranges = budget(len(prefixes), LISTINGS_IN_FLIGHT)
        await for_each(prefixes, functools.partial(self.under, ranges=ranges), LISTINGS_IN_FLIGHT)

    def _excludes_below(self, prefix: str) -> bool:
        """Whether an --exclude-path lies below `prefix`: its levels are then listed one by one, so that the
        excluded folder is never listed."""
        rel = prefix[len(self.root):]
        return any(p.startswith(rel) and len(p) > len(rel) for p in self.filters.exclude_paths)

    async def _levels(self, prefixes: list[str]) -> tuple[list[str], list[str]]:
        """One level of each prefix, side by side: the folders found below them, and the prefixes whose level was
        too wide to fan out (to be listed flat)."""
        found: list[str] = []
        too_wide: list[str] = []

        async def level(prefix: str) -> None:
            below = await self._level(prefix)
            if below is None:
                too_wide.append(prefix)
            else:
                found.extend(below)

        await for_each(prefixes, level, LISTINGS_IN_FLIGHT)
        return found, too_wide

    async def _level(self, prefix: str) -> list[str] | None:
        """The blobs directly under `prefix` into the index; the folders one level down the filters may enter, or
        None where there are more than FANOUT_MAX of them, or more than a page where the store lists from any name
        (then split by name), and no excluded folder lies below: `prefix` is then to be listed flat (what its level
        put in already is put again: the index keeps one entry per name)."""
        prefixes: list[str] = []
        marker = ""
        markers = Markers(f"list blobs under {prefix or '/'!r}")
        taken = 0
        while True:
            objects, below, marker = await self.request(functools.partial(self.store.list_level, prefix, marker))
            markers.next(marker)
            batch: list[Entry] = []
            before = self.listed
            for props in objects:
                self.take(props, batch)
            taken += self.listed - before
            self.add(batch)
            prefixes += [p for p in _below(prefix, below) if self.filters.enters(p[len(self.root):-1])]
            wide = len(prefixes) > FANOUT_MAX or (marker and self.store.capabilities.lists_from)
            if wide and not self._excludes_below(prefix):  # a flat listing would list the excluded folder
                self.listed -= taken  # counted again by the flat listing
                return None
            if not marker:
                return prefixes

    def add(self, batch: list[Entry]) -> None:
        self.index.add(self.side, batch)
        if self.listed > self._told:
            self.seen(self.listed - self._told)
            self._told = self.listed

    def take(self, props: BlobProperties, batch: list[Entry]) -> None:
        """A listed object into `batch` if the filters take it; one outside the root (a service answering what was
        not asked for) stops the listing: its name cut by the root's length would be another file's."""
        if not props.name.startswith(self.root):
            raise ServiceError(f"the service listed {printable(props.name[:200])!r}, which is not under "
                               f"{printable(self.root)!r}; the listing is not to be trusted", code="InvalidListing")
        if is_folder_marker(props):
            return
        self.listed += 1
        entry = remote_entry(self.root, props)
        if self.filters.matches(entry.rel, self.when(props, entry)):
            batch.append(entry)


MAX_NAME = 1024  # Azure's longest blob name: no folder of a real listing is longer


def _below(prefix: str, found: list[str]) -> list[str]:
    """The folders a level listing of `prefix` found, each checked to lie below it: a service answering a folder
    outside it, or `prefix` itself, would have the fan-out list elsewhere, or forever."""
    for p in found:
        if not (p.startswith(prefix) and len(prefix) < len(p) <= MAX_NAME and p.endswith("/")):
            raise ServiceError(f"the service listed a folder {printable(p[:200])!r} that is not below "
                               f"{printable(prefix)!r}; the listing is not to be trusted", code="InvalidListing")
    return found


async def blobs_at(store: Store, path: str, request: Requester) -> AsyncIterator[tuple[str, BlobProperties]]:
    """(relative name, properties) of the blob named `path` and of every blob under `path/`.

    One listing with `path` as its prefix answers both; names that only share the prefix ('a/bc' for 'a/b')
    are left out. Each page is one request under the retry policy; the next page is asked for before this one's
    blobs are handed out, so the service prepares it while the caller prints or deletes them."""
    prefix = folder_prefix(path)

    def fetch(marker: str) -> asyncio.Future[tuple[list[BlobProperties], str]]:
        return asyncio.ensure_future(request(functools.partial(store.list_page, path, marker)))

    ahead = fetch("")
    markers = Markers(f"list blobs under {path or '/'!r}")
    try:
        while True:
            page, marker = await ahead
            if markers.next(marker):
                ahead = fetch(marker)
                await asyncio.sleep(0)  # let the request leave now, not when the caller next awaits
            for props in page:
                if props.name == path and path and not path.endswith("/"):
                    yield props.name.rsplit("/", 1)[-1], props
                elif props.name.startswith(prefix) and not props.name.endswith("/"):
                    yield props.name[len(prefix):], props
            if not marker:
                return
    finally:
        if not ahead.done():  # the caller stopped early: drop the page nobody will read
            ahead.cancel()
            await asyncio.wait([ahead])
            if not ahead.cancelled():
                ahead.exception()  # retrieved: a failure of a page nobody asked for is not an error


async def one_blob(store: Store, request: Requester, name: str, verb: str) -> BlobProperties:
    """The blob `name` a download or copy of one blob takes, or why it cannot: a folder given without -r, or
    nothing there (`verb` says which command: 'download', 'copy')."""
    props = await request(functools.partial(store.stat, name))
    if props is not None:
        return props
    under, _ = await request(functools.partial(store.list_page, name + "/"))
    if under:
        raise UsageError(f"{name!r} is a folder (blobs are under {name + '/'!r}): pass -r/--recursive to {verb} "
                         "it, or end the URL with '/*' for the blobs at its top")
    raise BlobNotFoundError(f"blob {name!r} not found in container {store.location.container!r}", status=404,
                            code="BlobNotFound", hint="check the URL (names are case-sensitive)")
