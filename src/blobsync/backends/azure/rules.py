"""Azure Blob Storage's limits and naming rules: what a block, a blob, a tier, a metadata name or a tag may be.

The store's capabilities are made from them; a job's write options are checked against them (through those
capabilities) before any request."""

from __future__ import annotations

import re
from collections.abc import Mapping

from blobsync.errors import UsageError

MiB = 1024 * 1024
MAX_BLOCK_SIZE = 4000 * MiB  # one Put Block (service version 2019-12-12 and later)
MAX_PUT_BLOB_SIZE = 5000 * MiB  # one Put Blob
MAX_BLOCKS = 50_000  # committed blocks in one blob
MAX_COPY_SIZE = 256 * MiB  # one Copy Blob From URL (synchronous)
TIERS = ("Hot", "Cool", "Cold", "Archive")
# Properties a blob is stored with and returned on download, by AzCopy's flag names (--cache-control, ...).
BLOB_PROPERTIES = ("cache_control", "content_disposition", "content_encoding", "content_language")
MAX_TAGS = 10

_META_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a C# identifier (ASCII)
_TAG_TEXT = re.compile(r"^[A-Za-z0-9 +\-./:=_]*$")  # what blob index tag names and values may hold


def is_metadata_name(key: str) -> bool:
    """The one metadata name rule (a C# identifier), for user input here and for what a store sends."""
    return _META_NAME.match(key) is not None


def check_writes(metadata: Mapping[str, str], tags: Mapping[str, str]) -> None:
    """A write's metadata names and blob index tags as the service takes them (UsageError naming the flag)."""
    for key in metadata:
        if not is_metadata_name(key):
            raise UsageError(f"invalid --metadata name {key!r}: letters, digits and '_', not starting with a digit")
    for key, value in tags.items():
        if not (len(key) <= 128 and len(value) <= 256 and _TAG_TEXT.match(key) and _TAG_TEXT.match(value)):
            raise UsageError(f"invalid --blob-tags item {key}={value}: names up to 128 and values up to 256 "
                             "characters, from letters, digits, space and + - . / : = _")
    if len(tags) > MAX_TAGS:
        raise UsageError(f"--blob-tags has {len(tags)} tags: a blob holds at most {MAX_TAGS}")
