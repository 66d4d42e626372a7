"""What any storage service answers, read defensively: XML with no DTD or entity declarations and no compressed
body nobody asked for, Retry-After, lengths; a value that is not what it should be falls back or is a one-line
ServiceError, never a traceback."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from xml.etree import ElementTree

from blobsync.errors import ConflictError, CorruptedInTransitError, ServiceError

_DECLARATION = re.compile(rb"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)


def parse_xml(body: bytes, what: str) -> ElementTree.Element:
    """The root element of an answer to `what` ('list blobs in c'), or ServiceError saying why it is refused."""
    if body[:2] == b"\x1f\x8b":
        raise ServiceError(f"{what}: the service answered with a gzip-compressed body, which was not asked for")
    if b"\x00" in body or body[:2] in (b"\xff\xfe", b"\xfe\xff"):
        # Storage services answer in UTF-8; another encoding would also hide a DTD from the check below.
        raise ServiceError(f"{what}: the answer is not UTF-8 text, which every storage service sends; refused")
    if _DECLARATION.search(body):
        # A storage service never declares a DTD; entities in one could expand a small answer beyond any bound.
        raise ServiceError(f"{what}: the answer declares a DTD or entities, which no storage service sends; refused")
    try:
        parser = ElementTree.XMLParser(encoding="utf-8")  # whatever the body declares
        parser.feed(body)
        return parser.close()
    except ElementTree.ParseError as exc:
        raise ServiceError(f"{what}: the answer is not well-formed XML ({exc})") from None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds (0 to an hour): a number of seconds or an HTTP date; None for anything else."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value) if value.isascii() else math.nan
    except ValueError:
        pass
    else:  # 'inf' or 'nan' from a broken server must not park the job forever
        return min(max(0.0, seconds), 3600.0) if math.isfinite(seconds) else None
    from email.utils import parsedate_to_datetime  # an HTTP date here is rare: not loaded at start-up

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, (when - (now or datetime.now(UTC))).total_seconds()), 3600.0)


_CONTENT_RANGE = re.compile(r"bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)", re.ASCII)


def check_read(what: str, status: int, headers: Mapping[str, str], offset: int, length: int,
               if_match: str | None) -> None:
    """An answer to a (ranged) read is of the version and the bytes asked for: a server that ignores If-Match
    (the blob changed between two ranges) or answers another range would otherwise make a file of two versions
    or of the wrong bytes, which no check catches when the blob has no Content-MD5."""
    etag = headers.get("etag")
    if if_match and (etag or "").strip('"') != if_match.strip('"'):
        raise ConflictError(f"{what}: the service answered with another version than the one asked for (the blob "
                            "changed while it was read, and the If-Match condition was not applied)",
                            status=412, code="ConditionNotMet")
    if not length:
        return
    if status == 200:  # the whole blob: right only where it is exactly what was asked
        if offset != 0:
            raise CorruptedInTransitError(f"{what}: asked for bytes {offset}-{offset + length - 1}, answered with "
                                          "the whole blob")
        return
    got = _CONTENT_RANGE.fullmatch(headers.get("content-range", "").strip())
    if got is None or (int(got.group(1)), int(got.group(2))) != (offset, offset + length - 1):
        raise CorruptedInTransitError(f"{what}: asked for bytes {offset}-{offset + length - 1}, answered with "
                                      f"{headers.get('content-range', 'no Content-Range')[:60]!r}")
