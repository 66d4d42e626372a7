"""The List Blobs page scanner against ElementTree: same records for every page, and ElementTree for odd shapes."""

from __future__ import annotations

from xml.sax.saxutils import escape

import pytest
from hypothesis import given, settings, strategies as st

from blobsync.backends.azure import store as azure_rest
from blobsync.backends.azure.listing import _parse_listing_tree, _scan_listing, _Unsure, parse_listing as _parse_listing
from blobsync.errors import ServiceError

# As Azurite 3.37 writes a blob (one line, no whitespace); real Azure writes the same elements in the same order.
AZURITE_PROPS = (
    "<Creation-Time>Mon, 30 Nov 2026 07:48:35 GMT</Creation-Time><Last-Modified>Mon, 30 Nov 2026 07:48:35 GMT"
    "</Last-Modified><Etag>0x24932E7EAED7480</Etag><Content-Length>{size}</Content-Length><Content-Type>"
    "application/octet-stream</Content-Type><Content-MD5>1B2M2Y8AsgTpgAmY7PhCfg==</Content-MD5><BlobType>BlockBlob"
    "</BlobType><LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState><ServerEncrypted>true"
    "</ServerEncrypted><AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
    "<AccessTierChangeTime>Mon, 30 Nov 2026 07:48:35 GMT</AccessTierChangeTime>"
)
# As the Azure REST reference shows one: empty elements written as <X />, metadata, tags and OR metadata.
AZURE_PROPS = (
    "<Creation-Time>Tue, 01 Dec 2026 10:00:00 GMT</Creation-Time><Last-Modified>Tue, 01 Dec 2026 10:00:01 GMT"
    "</Last-Modified><Etag>0x8DBF1234567890A</Etag><Content-Length>{size}</Content-Length><Content-Type>text/plain; "
    "charset=&quot;utf-8&quot;</Content-Type><Content-Encoding /><Content-Language /><Content-CRC64 />"
    "<Content-MD5 /><Cache-Control /><Content-Disposition /><BlobType>BlockBlob</BlobType><AccessTier>Cool"
    "</AccessTier><AccessTierInferred>false</AccessTierInferred><LeaseStatus>unlocked</LeaseStatus>"
    "<LeaseState>available</LeaseState><ServerEncrypted>true</ServerEncrypted>"
)


def page(blobs: list[str], next_marker: str | None = "", bom: bool = False, head: str = "") -> bytes:
    marker = "<NextMarker/>" if next_marker == "" else "" if next_marker is None else \
        f"<NextMarker>{escape(next_marker)}</NextMarker>"
    text = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?><EnumerationResults '
            'ServiceEndpoint="http://127.0.0.1:10000/devstoreaccount1" ContainerName="c">'
            f"{head}<Prefix/><Marker/><MaxResults>5000</MaxResults><Blobs>{''.join(blobs)}</Blobs>{marker}"
            "</EnumerationResults>")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


def blob(name: str, props: str = AZURITE_PROPS, metadata: str | None = "<Metadata/>", size: int = 3,
         before: str = "", after: str = "") -> str:
    return (f"<Blob><Name>{name}</Name>{before}<Properties>{props.format(size=size)}</Properties>"
            f"{metadata or ''}{after}</Blob>")


def same(body: bytes) -> None:
    assert _parse_listing(body) == _parse_listing_tree(body)


def scanned(body: bytes) -> tuple[list[azure_rest.BlobProperties], str]:
    result = _scan_listing(body)  # no fallback: the scanner itself read it
    assert result == _parse_listing_tree(body)
    return result


def test_azurite_page_with_escapes_unicode_and_metadata() -> None:
    body = page([
        blob("a&amp;b &lt;c&gt; &quot;d&quot; &apos;e&apos;", metadata="<Metadata><mtime>2026-11-30T05:14:56Z"
             "</mtime><note>x &amp; y &#x263A; &#233;</note><empty/></Metadata>"),
        blob("dir one/naïve файл.txt", size=0),
        blob("tab&#9;and&#x1F600;", metadata=None),
        blob("plain", metadata="<Metadata />"),
    ], next_marker="next&one")
    blobs, marker = scanned(body)
    assert [b.name for b in blobs] == ['a&b <c> "d" \'e\'', "dir one/naïve файл.txt", "tab\tand\U0001F600", "plain"]
    assert blobs[0].metadata == {"mtime": "2026-11-30T05:14:56Z", "note": "x & y ☺ é", "empty": ""}
    assert blobs[0].content_md5 == bytes.fromhex("d41d8cd98f00b204e9800998ecf8427e")
    assert blobs[1].size == 0 and blobs[2].metadata == {} and blobs[0].tier == "Hot"
    assert marker == "next&one"


def test_azure_reference_page_with_bom_empty_elements_tags_and_snapshots() -> None:
    body = page([
        blob("x", AZURE_PROPS, "<Metadata><Color>blue</Color></Metadata>",
             before="<Snapshot>2026-12-01T10:00:00.0000000Z</Snapshot><VersionId>v1</VersionId>"
                    "<IsCurrentVersion>true</IsCurrentVersion>",
             after="<Tags><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tags><OrMetadata />"),
        blob("y", AZURE_PROPS.replace("<AccessTier>Cool</AccessTier>", ""), "<Metadata />"),
    ], next_marker=None, bom=True, head="<Prefix>p</Prefix>")
    blobs, marker = scanned(body)
    assert blobs[0].content_type == 'text/plain; charset="utf-8"' and blobs[0].content_md5 is None
    assert blobs[0].metadata == {"Color": "blue"} and blobs[0].tier == "Cool" and blobs[1].tier is None
    assert marker == ""


def test_empty_page_and_missing_properties() -> None:
    assert scanned(page([])) == ([], "")
    blobs, _ = scanned(page([blob("n", "<Etag/><Content-Type></Content-Type>")]))
    assert blobs[0].content_type == "" and blobs[0].etag == "" and blobs[0].size == 0 and blobs[0].blob_type is None


@pytest.mark.parametrize("body", [
    page([blob("a").replace("<Name>a</Name>", '<Name Encoded="true">%EF%BF%BF</Name>')]),
    page([blob("a", metadata="<Metadata><Metadata>m</Metadata><Blob>b</Blob></Metadata>")]),
    page([blob("a", metadata="<Metadata><k><nested/></k></Metadata>")]),
    page([blob("a", metadata=None, after="<Tags/><Metadata><k>v</k></Metadata>")]),
    page([blob("a", metadata=None, before="<Metadata><k>v</k></Metadata>")]),
    page([blob("a", before="<Extra><Properties><Etag>inner</Etag></Properties></Extra>")]),
    page([blob("a", AZURITE_PROPS.replace("<Etag>", '<Etag kind="x">'))]),
    page([blob("a", AZURITE_PROPS + "<Etag>second</Etag>")]),  # ElementTree's find takes the first
    page([blob("a", "<Etag>e</Etag><Last-Modified>Mon, 30 Nov 2026 07:48:35 GMT</Last-Modified>")]),  # order
    page([blob("<![CDATA[a<b]]>")]),
    page([blob("a<!-- note -->")]),
    page([blob("cr\r\nlf")]),  # XML turns a literal CR LF into LF
    page([blob("a")], next_marker="m").replace(b"<NextMarker>", b'<NextMarker x="1">'),
])
def test_odd_shapes_go_to_elementtree(body: bytes) -> None:
    with pytest.raises((_Unsure, UnicodeDecodeError)):
        _scan_listing(body)
    same(body)


def test_whitespace_between_elements_reads_the_same() -> None:
    body = page([blob("a", metadata="<Metadata><k>v</k></Metadata>"), blob("b")], next_marker="b")
    same(body.replace(b"><", b">\n  <"))
    same(body.replace(b"<Blob>", b"\n<Blob>").replace(b"</Blobs>", b"\n</Blobs>\n"))


def test_a_cut_page_is_an_error_not_a_short_list() -> None:
    body = page([blob("a"), blob("b")], next_marker="b")
    for cut in (len(body) - 5, len(body) // 2):
        with pytest.raises(ServiceError, match="not well-formed XML"):
            _parse_listing(body[:cut])


NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\ufffe\uffff",
                              max_codepoint=0x1F700), min_size=1, max_size=12)
KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


def _xml_char(c: str) -> bool:
    o = ord(c)
    return o in (0x9, 0xA) or 0x20 <= o <= 0xD7FF or 0xE000 <= o <= 0xFFFD or o >= 0x10000


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(NAMES.filter(lambda s: all(map(_xml_char, s))),
                          st.dictionaries(KEYS, NAMES.filter(lambda s: all(map(_xml_char, s))), max_size=3),
                          st.booleans()), max_size=6),
       st.booleans())
def test_scanner_matches_elementtree(entries: list[tuple[str, dict[str, str], bool]], refs: bool) -> None:
    def enc(text: str) -> str:
        out = escape(text, {'"': "&quot;", "'": "&apos;"})
        return "".join(f"&#x{ord(c):X};" if refs and not c.isascii() else c for c in out)

    blobs = [blob(enc(name), metadata="<Metadata>" + "".join(f"<{k}>{enc(v)}</{k}>" for k, v in meta.items())
                  + "</Metadata>" if meta or flag else None)
             for name, meta, flag in entries]
    body = page(blobs, next_marker=entries[-1][0] if entries else "")
    assert scanned(body)[0] == _parse_listing_tree(body)[0]


def test_request_dates_match_email_utils() -> None:
    from email.utils import formatdate

    for second in (0, 951_782_400, 1_796_025_605, 4_102_444_799, *range(1_700_000_000, 1_800_000_000, 86_399_999)):
        assert azure_rest._http_date(second) == formatdate(second, usegmt=True)


def test_percent_encoded_names_are_decoded() -> None:
    # Azure percent-encodes names holding characters XML 1.0 cannot carry, and flags them Encoded="true".
    body = page([blob("a").replace("<Name>a</Name>", '<Name Encoded="true">bad%EF%BF%BFname%25.bin</Name>'),
                 blob("plain%41")])
    blobs, _ = _parse_listing(body)
    assert [b.name for b in blobs] == ["bad\uffffname%.bin", "plain%41"]  # only the flagged name is decoded


def test_a_listed_blob_is_the_dataclass_own_with_every_field() -> None:
    """listed_blob skips the frozen dataclass's __init__ (a listing's hot path): what it makes must equal what the
    dataclass makes, field for field, whatever fields BlobProperties gains."""
    import dataclasses
    from datetime import UTC, datetime

    from blobsync.backends.base import BlobProperties, listed_blob

    args = ("a/b.bin", 7, "0x8D1", datetime(2025, 1, 1, tzinfo=UTC), b"\x01" * 16, "text/plain", {"mtime": "x"},
            "BlockBlob", "Hot")
    made, own = listed_blob(*args), BlobProperties(*args)
    assert made == own and repr(made) == repr(own) and hash(made.name) == hash(own.name)
    assert set(vars(made)) == {f.name for f in dataclasses.fields(BlobProperties)}
    assert dataclasses.replace(made, size=8).size == 8
    assert made.properties == {} and made.properties is not listed_blob(*args).properties
