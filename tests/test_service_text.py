"""Every value read from the service and parsed (metadata, headers, listing XML) either parses or falls back;
nothing a server sends raises anything but a blobsync error for that blob (issue 26, point 9)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from blobsync.backends.answers import parse_retry_after
from blobsync.backends.azure import listing as store
from blobsync.backends.s3 import store as s3
from blobsync.engine.mtime import parse_mtime
from blobsync.errors import BlobsyncError, ServiceError
from conftest import ContainerHandle
from support.cli import run


@given(st.text())
@settings(max_examples=400)
def test_mtime_metadata_parses_or_falls_back(text: str) -> None:
    got = parse_mtime(text)
    assert got is None or isinstance(got, int)


def test_the_superscript_two_falls_back() -> None:
    assert parse_mtime("2026-01-01T00:00:00.\u00b2Z") is None
    assert parse_mtime("\u0662026-01-01T00:00:00Z") is None
    assert parse_mtime("2026-13-01T00:00:00Z") is None
    assert parse_mtime("2026-01-01T00:00:00.5Z") == 1767225600_500000000


@given(st.text())
@settings(max_examples=300)
def test_header_parsers_never_raise(text: str) -> None:
    assert store._parse_http_date(text) is None or store._parse_http_date(text) is not None
    assert store.md5_header(text) is None or len(store.md5_header(text) or b"") == 16
    after = parse_retry_after(text)
    assert after is None or 0 <= after <= 3600
    store._listed_date(text)
    with contextlib.suppress(BlobsyncError):
        assert store.parse_length(text, "b") >= 0


def test_retry_after_inf_and_nan_do_not_park_the_job() -> None:
    assert parse_retry_after("inf") is None and parse_retry_after("nan") is None
    assert parse_retry_after("1e9") == 3600


_PAGE = ('<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs>'
         '<Blob><Name>{name}</Name><Properties><Last-Modified>{date}</Last-Modified><Etag>0x1</Etag>'
         '<Content-Length>{size}</Content-Length><Content-MD5>{md5}</Content-MD5></Properties>'
         '<Metadata><mtime>{mtime}</mtime></Metadata></Blob></Blobs><NextMarker /></EnumerationResults>')
_XML_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>&\r\x00"),
                    max_size=30)


@given(name=_XML_TEXT, date=_XML_TEXT, size=_XML_TEXT, md5=_XML_TEXT, mtime=_XML_TEXT)
@settings(max_examples=300)
def test_a_listing_page_parses_or_fails_with_a_blobsync_error(name: str, date: str, size: str, md5: str,
                                                             mtime: str) -> None:
    body = _PAGE.format(name=name, date=date, size=size, md5=md5, mtime=mtime).encode()
    try:
        blobs, _ = store.parse_listing(body)
    except BlobsyncError:  # a character XML 1.0 cannot hold, a length that is not one: a line, not a traceback
        return
    for blob in blobs:
        parse_mtime(blob.metadata.get("mtime", ""))


@given(st.binary(max_size=300))
@settings(max_examples=200)
def test_arbitrary_bytes_as_a_listing_are_a_blobsync_error_at_worst(body: bytes) -> None:
    for parse in (store.parse_listing, store.parse_level, s3._listed):
        with contextlib.suppress(BlobsyncError):
            parse(body)


_HOSTILE = {
    "dtd": b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
           b"<EnumerationResults><Blobs><Blob><Name>&b;</Name></Blob></Blobs><NextMarker/></EnumerationResults>",
    "gzip": __import__("gzip").compress(_PAGE.format(name="a", date="", size="1", md5="", mtime="").encode()),
    "control": _PAGE.format(name="a\x01b", date="", size="1", md5="", mtime="").encode(),
    "superscript-size": b"<ListBucketResult><Contents><Key>k</Key><Size>\xc2\xb2</Size></Contents>"
                        b"</ListBucketResult>",
}


@pytest.mark.parametrize("kind", sorted(_HOSTILE))
def test_hostile_listings_are_one_line_errors(kind: str) -> None:
    for parse in (store.parse_listing, store.parse_level, s3._listed):
        if kind == "superscript-size" and parse is not s3._listed:
            continue
        with pytest.raises(ServiceError) as caught:
            parse(_HOSTILE[kind])
        assert "\n" not in str(caught.value)


def test_s3s_retry_after_is_read_like_azures() -> None:
    error = s3._error(503, {"retry-after": "\u00b2"}, b"", "get k")
    assert error.retryable and getattr(error, "retry_after", None) is None
    assert getattr(s3._error(503, {"retry-after": "7"}, b"", "get k"), "retry_after", None) == 7.0


def test_a_blob_with_odd_mtime_metadata_does_not_stop_the_job(container: ContainerHandle, tmp_path: Path) -> None:
    container.client.upload_blob("odd.txt", b"odd", metadata={"mtime": "2026-01-01T00:00:00.\u00b2Z"})
    assert container.client.get_blob_client("odd.txt").get_blob_properties().metadata["mtime"].endswith("\u00b2Z")
    container.client.upload_blob("fine.txt", b"fine")
    for args in (["cp", "-r", f"{container.url}/*", str(tmp_path / "dl")],
                 ["sync", container.url, str(tmp_path / "dl2")]):
        done = run([*args, "--journal", str(tmp_path / "j.db")])
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    assert (tmp_path / "dl" / "odd.txt").read_bytes() == container.download("odd.txt")
