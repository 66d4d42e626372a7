"""What Azure answers, read defensively: blob properties from response headers and List Blobs pages (a fast
scanner for the pages Azure writes, the XML tree for anything it does not vouch for). A value that is not what it
should be falls back, or fails that one blob with a ServiceError; never the process."""

from __future__ import annotations

import binascii
import itertools
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import unquote

from blobsync.backends.answers import parse_xml
from blobsync.backends.base import INVALID_LENGTH, BlobProperties, listed_blob
from blobsync.errors import ServiceError
from blobsync.redact import printable

if TYPE_CHECKING:
    from xml.etree import ElementTree

MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

_MONTHS = {m: i for i, m in enumerate(MONTH_NAMES, 1)}


def _parse_http_date(value: str | None) -> datetime | None:
    """RFC 1123 dates ('Mon, 30 Nov 2026 04:07:23 GMT'), the only form Azure sends; parsed by hand because a
    listing has one per blob and the email.utils parser costs ~8 µs each."""
    if not value:
        return None
    parts = value.split()
    if len(parts) == 6 and parts[5] == "GMT" and parts[2] in _MONTHS:
        try:
            hh, mm, ss = (int(x) for x in parts[4].split(":"))
            return datetime(int(parts[3]), _MONTHS[parts[2]], int(parts[1]), hh, mm, ss, tzinfo=UTC)
        except ValueError:
            pass
    from email.utils import parsedate_to_datetime  # other forms are rare: its import is not paid up front

    try:
        return parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None


_EPOCH = datetime.fromtimestamp(0, UTC)



def md5_header(value: str | None) -> bytes | None:
    """A Content-MD5 header's digest; None if absent or not 16 bytes of base64 (never a crash)."""
    if not value:
        return None
    try:  # binascii's own strict decoder: base64.b64decode's checks around it cost twice its work, once per blob
        digest = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return digest if len(digest) == 16 else None


MAX_LENGTH = 1 << 62  # beyond any blob (Azure's largest is ~190 TiB), and within what SQLite stores


def parse_length(value: str | None, name: str, *, listed: bool = False) -> int:
    """A blob's length as the service sent it. Text that is not a length fails this blob, never the process: a
    ServiceError here (an answer about this blob alone), or INVALID_LENGTH for a listed one (the listing goes on;
    the blob's own operation fails with one line)."""
    if not value:
        return 0
    if not (value.isascii() and value.isdigit() and len(value) < 20 and int(value) <= MAX_LENGTH):
        if listed:
            return INVALID_LENGTH
        raise ServiceError(f"the service sent {printable(name)!r} with an invalid length {printable(value[:40])!r}; "
                           "this blob is not transferred", code="InvalidContentLength")
    return int(value)


def properties_from_headers(name: str, h: Mapping[str, str]) -> BlobProperties:
    return BlobProperties(
        name=name,
        size=parse_length(h.get("content-length"), name),
        etag=h.get("etag", ""),
        last_modified=_parse_http_date(h.get("last-modified")) or _EPOCH,
        content_md5=md5_header(h.get("content-md5")),
        content_type=h.get("content-type"),
        metadata={k[len("x-ms-meta-"):]: v for k, v in h.items() if k.startswith("x-ms-meta-")},
        blob_type=h.get("x-ms-blob-type"),
        tier=h.get("x-ms-access-tier"),
        properties={key: value for key, header in _PROPERTY_NAMES if (value := h.get(header.lower()))},
    )


# The properties a reader gets back as headers (rules.BLOB_PROPERTIES), as HTTP and List Blobs name them.
_PROPERTY_NAMES = (("cache_control", "Cache-Control"), ("content_disposition", "Content-Disposition"),
                   ("content_encoding", "Content-Encoding"), ("content_language", "Content-Language"))


def _listed_properties(blob: ElementTree.Element) -> BlobProperties:
    props = blob.find("Properties")

    def get(tag: str) -> str | None:
        return props.findtext(tag) if props is not None else None

    meta = blob.find("Metadata")
    node = blob.find("Name")
    name = node.text or "" if node is not None else ""
    if node is not None and node.get("Encoded", "").lower() == "true":
        # Names holding characters XML 1.0 cannot carry come percent-encoded, flagged Encoded="true".
        name = unquote(name)
    return _record(name, get, {m.tag: m.text or "" for m in meta} if meta is not None else {})


def _record(name: str, get: Callable[[str], str | None], metadata: dict[str, str]) -> BlobProperties:
    md5 = get("Content-MD5")
    return BlobProperties(
        name=name,
        size=parse_length(get("Content-Length"), name, listed=True),
        etag=get("Etag") or "",
        last_modified=_listed_date(get("Last-Modified")),
        content_md5=md5_header(md5),
        content_type=get("Content-Type"),
        metadata=metadata,
        blob_type=get("BlobType"),
        tier=get("AccessTier"),
        properties={key: value for key, tag in _PROPERTY_NAMES if (value := get(tag))},
    )


_DATES: dict[str, datetime] = {}


def _listed_date(value: str | None) -> datetime:
    """A listed Last-Modified, parsed once per distinct text: blobs written in the same second share it."""
    if not value:
        return _EPOCH
    parsed = _DATES.get(value)
    if parsed is None:
        if len(_DATES) >= 4096:  # bounded: a listing of blobs written over years must not grow it forever
            _DATES.clear()
        parsed = _DATES[value] = _parse_http_date(value) or _EPOCH
    return parsed


def _parse_listing_tree(body: bytes) -> tuple[list[BlobProperties], str]:
    """The reference reading of a page (ElementTree), for every page the scanner below does not vouch for."""
    root = parse_xml(body, "list blobs")
    return [_listed_properties(blob) for blob in root.iterfind("Blobs/Blob")], root.findtext("NextMarker") or ""


def parse_level(body: bytes) -> tuple[list[BlobProperties], list[str], str]:
    """A page listed with delimiter '/': the blobs at this level, the prefixes one level down, the next marker."""
    root = parse_xml(body, "list blobs")
    prefixes = []
    for node in root.iterfind("Blobs/BlobPrefix/Name"):
        name = node.text or ""
        prefixes.append(unquote(name) if node.get("Encoded", "").lower() == "true" else name)
    return ([_listed_properties(blob) for blob in root.iterfind("Blobs/Blob")], prefixes,
            root.findtext("NextMarker") or "")


# A page holds ~700 bytes of XML per blob, and ElementTree plus findtext cost ~20 µs a blob: more than the rest of a
# no-op sync's work per file. The scanner reads the shape the service writes with one regex match per blob.
# It relies on well-formed XML ('<' in text is always escaped) and checks the rest: no whitespace between elements,
# no attributes on the elements it reads, no CDATA, comments or CRs (XML would normalise those), Name first,
# Properties a flat list of leaf elements with the ones we read in the documented order, Metadata (flat) right after
# Properties. Any page it cannot vouch for goes to ElementTree: an unexpected shape costs time, never a wrong answer.
_TAG = r"[^\s/<>!?]+"
_READ = "Last-Modified|Etag|Content-(?:Length|Type|MD5)|BlobType|AccessTier"
# Possessive (*+): a run of leaves never needs to give one back, and not keeping backtrack points is ~20% faster.
_SKIP = rf"(?:<(?!(?:{_READ})[ />]){_TAG} ?(?:/>|>[^<]*</{_TAG}>))*+"  # leaves we do not read; never one we do
_LEAVES = rf"(?:<{_TAG} ?(?:/>|>[^<]*</{_TAG}>))*+"


def _read(tag: str, presence: bool = False) -> str:
    """An optional <tag>text</tag> or <tag/>: its text in a group; with `presence`, a second group that is ''
    (not None) when the element is there, so an empty element reads as '' and a missing one as None."""
    return rf"(?:<{tag}(?:>([^<]*)</{tag}>| ?/>){'()' if presence else ''})?" + _SKIP


_BLOB = re.compile(
    r"<Name>([^<]*)</Name>"
    + rf"(?:<(?!(?:Properties|Metadata)[ />]){_TAG} ?(?:/>|>[^<]*</{_TAG}>))*+"  # Snapshot, VersionId, Deleted, ...
    + "<Properties>" + _SKIP + _read("Last-Modified") + _read("Etag") + _read("Content-Length")
    + _read("Content-Type", True) + _read("Content-MD5") + _read("BlobType", True) + _read("AccessTier", True)
    + rf"</Properties>(?:<Metadata ?/>|<Metadata>({_LEAVES})</Metadata>)?"
    + r"((?:<(?!/Blob>)[^<]*)*)</Blob>"  # Tags, OrMetadata, ...: up to this blob's end
)
_PAIRS = re.compile(rf"<({_TAG}) ?(?:/>|>([^<]*)</\1>)")
_NEXT_MARKER = re.compile(r"</Blobs>(?:<NextMarker>([^<]*)</NextMarker>|<NextMarker ?/>)?</EnumerationResults>")
_ENTITY = re.compile(r"&(?:#x([0-9A-Fa-f]+)|#([0-9]+)|(amp|lt|gt|quot|apos));")
_CONTROLS = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20)])  # the C0 controls XML 1.0 cannot hold
_OTHER_AMP = re.compile(r"&(?!(?:#x[0-9A-Fa-f]+|#[0-9]+|amp|lt|gt|quot|apos);)")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def _entity(m: re.Match[str]) -> str:
    hexa, dec, named = m.groups()
    if named:
        return _NAMED[named]
    digits = hexa or dec
    code = int(digits, 16 if hexa else 10) if len(digits) <= 8 else -1
    if not 0 < code <= 0x10FFFF:  # not a character: the page is not XML (ValueError: refused, one line)
        raise ValueError("a character reference out of range")
    return chr(code)


def _text(raw: str) -> str:
    """Character data: the five predefined entities and character references are all XML lets a page hold."""
    return _ENTITY.sub(_entity, raw) if "&" in raw else raw


class _Unsure(Exception):
    """A page the scanner does not vouch for."""


def _scan_blob(chunk: str) -> BlobProperties:
    """One blob, from the text after its <Blob> up to the next one (its </Blob> included)."""
    m = _BLOB.fullmatch(chunk)
    if m is None:
        raise _Unsure
    (name, modified, etag, length, ctype, has_ctype, md5, btype, has_btype, tier, has_tier, meta, after
     ) = m.groups()
    if after and "<Metadata" in after:
        raise _Unsure  # metadata out of its place
    if "&" in chunk:  # entities to resolve: each value through _text
        return _scanned(name, modified, etag, length, ctype, has_ctype, md5, btype, has_btype, tier, has_tier, meta,
                        _text)
    # The common case, values as they stand (a sync reads one blob of each side per object: this is its hot path).
    size = int(length) if length and length.isascii() and length.isdigit() and len(length) < 19 else \
        parse_length(length or None, name, listed=True)
    return listed_blob(name, size, etag or "", _listed_date(modified or None), md5_header(md5) if md5 else None,
                       ctype or "" if has_ctype is not None else None, dict(_PAIRS.findall(meta)) if meta else {},
                       btype or "" if has_btype is not None else None, tier or "" if has_tier is not None else None)


def _scanned(name: str, modified: str | None, etag: str | None, length: str | None, ctype: str | None,
             has_ctype: str | None, md5: str | None, btype: str | None, has_btype: str | None, tier: str | None,
             has_tier: str | None, meta: str | None, text: Callable[[str], str]) -> BlobProperties:
    return BlobProperties(
        name=text(name),
        size=parse_length(text(length) if length else None, text(name), listed=True),
        etag=text(etag) if etag else "",
        last_modified=_listed_date(text(modified) if modified else None),
        content_md5=md5_header(text(md5)) if md5 else None,
        content_type=text(ctype or "") if has_ctype is not None else None,
        metadata={key: text(value) for key, value in _PAIRS.findall(meta)} if meta else {},
        blob_type=text(btype or "") if has_btype is not None else None,
        tier=text(tier or "") if has_tier is not None else None,
    )


def _not_xml(body: bytes) -> bool:
    """Whether the page holds a character XML 1.0 cannot (a C0 control, U+FFFE, U+FFFF): checked on the bytes, as
    a regex over the text cost ~1.7 µs a blob, a fifth of the scan."""
    return (len(body.translate(None, _CONTROLS)) != len(body)
            or (not body.isascii() and (b"\xef\xbf\xbe" in body or b"\xef\xbf\xbf" in body)))


def _scan_listing(body: bytes) -> tuple[list[BlobProperties], str]:
    if b"\r" in body or b"<!" in body or _not_xml(body):
        raise _Unsure
    text = body.decode("utf-8-sig").rstrip()
    end = text.rfind("</Blobs>")
    tail = _NEXT_MARKER.fullmatch(text, end) if end >= 0 else None
    if tail is None or ("&" in text and _OTHER_AMP.search(text)):
        raise _Unsure
    chunks = text[:end].split("<Blob>")
    return [_scan_blob(chunk) for chunk in itertools.islice(chunks, 1, None)], _text(tail.group(1) or "")


def parse_listing(body: bytes) -> tuple[list[BlobProperties], str]:
    """One List Blobs page: its blobs, and the marker of the next page ('' after the last)."""
    try:
        return _scan_listing(body)
    except (_Unsure, ValueError):  # ValueError: undecodable text, a character reference out of range
        return _parse_listing_tree(body)


def next_marker_guess(body: bytes) -> str:
    """The NextMarker of a listing, found without parsing the whole page (it sits at the end)."""
    start = body.rfind(b"<NextMarker>")
    if start < 0:
        return ""
    end = body.find(b"</NextMarker>", start)
    try:
        return _text(body[start + len(b"<NextMarker>"):end].decode("utf-8")) if end > 0 else ""
    except ValueError:  # not text, or not XML: a guess only; the page's own reading says what is wrong
        return ""


def parse_tags(body: bytes) -> dict[str, str]:
    """A Get Blob Tags answer: <Tags><TagSet><Tag><Key/><Value/></Tag>...</TagSet></Tags>."""
    root = parse_xml(body, "get blob tags")
    return {tag.findtext("Key") or "": tag.findtext("Value") or "" for tag in root.iter("Tag")}
