"""Azure Blob Storage's limits and naming rules: what a block, a blob, a tier, a metadata name or a tag may be.

The flags that take these values (AzCopy's) are checked against them before any request; the store's
capabilities are made from them."""

from __future__ import annotations

import re

from blobsync.arguments import check_header_text
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


def check_metadata(key: str, value: str, what: str = "metadata") -> None:
    """One metadata pair: the name a C# identifier, the value ASCII header text (UsageError naming `what`)."""
    if not is_metadata_name(key):
        raise UsageError(f"invalid {what} name {key!r}: letters, digits and '_', not starting with a digit")
    check_header_text(value, f"{what} value for {key!r}", ascii_only=True)


def check_tag(key: str, value: str, item: str) -> None:
    """One blob index tag: names up to 128 and values up to 256 characters of the allowed ones."""
    if not (len(key) <= 128 and len(value) <= 256 and _TAG_TEXT.match(key) and _TAG_TEXT.match(value)):
        raise UsageError(f"invalid --blob-tags item {item!r}: names up to 128 and values up to 256 characters, "
                         "from letters, digits, space and + - . / : = _")


def tier_named(text: str | None) -> str | None:
    """The tier `text` names, whatever its case; None if it names none."""
    return next((t for t in TIERS if text and t.lower() == text.lower()), None)
