"""Blobs as scratch-index entries and back: a listing of millions is kept in SQLite, not in memory."""

from __future__ import annotations

from datetime import UTC, datetime

from blobsync.backends.base import BlobProperties
from blobsync.engine.mtime import MTIME_KEY, format_mtime, parse_mtime
from blobsync.journal.index import Entry
from blobsync.naming import relative_name


def is_folder_marker(props: BlobProperties) -> bool:
    """A blob that stands for a folder, not a file: a name ending in '/', or a Data Lake / hierarchical-namespace
    stub (metadata hdi_isfolder=true, as AzCopy skips them by default). Never downloaded, never compared."""
    if props.name.endswith("/"):
        return True
    return any(k.lower() == "hdi_isfolder" and v.lower() == "true" for k, v in props.metadata.items())


def remote_entry(prefix: str, props: BlobProperties) -> Entry:
    """A listed blob under `prefix` as an index entry: its relative name, size, mtime (the stored one if any)."""
    stored = props.metadata.get(MTIME_KEY)
    mtime = parse_mtime(stored) if stored else None
    exact = mtime is not None
    if mtime is None:
        mtime = int(props.last_modified.timestamp()) * 1_000_000_000
    return Entry(relative_name(prefix, props.name), props.size, mtime, exact, props.content_md5, props.etag, props.name)


def as_properties(entry: Entry) -> BlobProperties:
    """Enough of a blob's properties for the downloader, rebuilt from the listing entry."""
    metadata = {MTIME_KEY: format_mtime(entry.mtime_ns)} if entry.exact_mtime else {}
    return BlobProperties(entry.name or entry.rel, entry.size, entry.etag or "",
                          datetime.fromtimestamp(entry.mtime_ns / 1e9, UTC), entry.md5, None, metadata)
