"""Malformed answers from the endpoint (a broken proxy, a middlebox, a fake service): one clear line, no traceback,
no hang past the stall timeout. A scripted server on 127.0.0.1 sends each answer to every request."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cli import run

_XML = b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs></Blobs><NextMarker/></EnumerationResults>'

ANSWERS = {
    "superscript-status": b"HTTP/1.1 2\xc2\xb900 OK\r\nContent-Length: 0\r\n\r\n",
    "superscript-length": "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode(),
    "duplicate-length": b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "negative-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello",
    "hex-prefixed-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    "plus-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
    "huge-head": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 200_000 + b"\r\nContent-Length: 0\r\n\r\n",
    "not-http": b"SSH-2.0-OpenSSH_9.2\r\n",
    "short-body": b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\nonly a little",
}


class _Server:
    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(self.answer)
            await writer.drain()
            await asyncio.sleep(0.2)
        writer.close()

    def __enter__(self) -> _Server:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0),
                                                  self.loop).result(10)
        self.server = server
        self.port = server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(params=sorted(ANSWERS))
def bad_server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    with _Server(ANSWERS[request.param]) as server:
        yield server


def test_a_malformed_answer_is_one_clear_line_and_no_hang(bad_server: _Server, tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{bad_server.port}/devstoreaccount1/cont"
    for args in (["ls", base, "--max-retries", "1"],
                 ["cp", f"{base}/blob.bin", str(tmp_path / "got.bin"), "--max-retries", "1", "--stall-timeout", "2",
                  "--journal", str(tmp_path / "j.db")]):
        started = time.monotonic()
        done = run(args, timeout=60)
        assert time.monotonic() - started < 30, args
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("blobsync: error:")]
        assert len(errors) == 1, done.stderr
    assert not (tmp_path / "got.bin").exists()


def test_a_bad_content_md5_header_is_no_crash(tmp_path: Path) -> None:
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(_XML)).encode() + b"\r\nContent-MD5: not base64!\r\n"
              b"Content-Type: application/xml\r\n\r\n" + _XML)
    with _Server(answer) as server:
        done = run(["ls", f"http://127.0.0.1:{server.port}/devstoreaccount1/cont"], timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0 and "0 blob(s)" in done.stdout, done.stderr


def _xml_answer(body: bytes, *headers: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)


_LISTED = (b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs><Blob><Name>%s</Name><Properties>'
           b"<Content-Length>3</Content-Length></Properties></Blob></Blobs><NextMarker/></EnumerationResults>")
LISTINGS = {
    "dtd": _xml_answer(b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa">]>'
                       + _LISTED.split(b"?>", 1)[1] % b"&a;"),
    "gzip": _xml_answer(__import__("gzip").compress(_LISTED % b"a.bin"), b"Content-Encoding: gzip"),
    "control-character": _xml_answer(_LISTED % b"a\x01b.bin"),
    # issue 51: an OverflowError, a UnicodeDecodeError and an expanded entity before
    "huge-character-reference": _xml_answer(_LISTED % b"a&#99999999999999999999999;b"),
    "huge-marker-reference": _xml_answer((_LISTED % b"a.bin").replace(b"<NextMarker/>",
                                                                       b"<NextMarker>&#x99999999999;</NextMarker>")),
    "non-utf8-marker": _xml_answer((_LISTED % b"a.bin").replace(b"<NextMarker/>",
                                                                 b"<NextMarker>\xff\xfe\xfa</NextMarker>")),
    "utf16-dtd": _xml_answer(('<?xml version="1.0" encoding="utf-16"?><!DOCTYPE r [<!ENTITY a "' + "a" * 1000
                              + '">]>' + (_LISTED % b"&a;&a;&a;").decode().split("?>", 1)[1]).encode("utf-16")),
}


@pytest.mark.parametrize("kind", sorted(LISTINGS))
def test_a_hostile_listing_is_one_line_on_every_listing_path(kind: str, tmp_path: Path) -> None:
    with _Server(LISTINGS[kind]) as server:
        base = f"http://127.0.0.1:{server.port}/devstoreaccount1/cont"
        journal = ["--journal", str(tmp_path / "j.db")]
        for args in (["ls", base], ["cp", "-r", f"{base}/*", str(tmp_path / "dl"), *journal],
                     ["cp", "-r", f"{base}/*", str(tmp_path / "dl"), "--processes", "2", *journal],
                     ["sync", base, str(tmp_path / "dl"), *journal]):
            done = run([*args, "--max-retries", "1"], timeout=60)
            assert "Traceback" not in done.stderr, (args, done.stderr)
            assert done.returncode == 1, (args, done.stdout, done.stderr)
            errors = [line for line in done.stderr.splitlines() if line.startswith("blobsync: error:")]
            assert len(errors) == 1, done.stderr
    assert not (tmp_path / "dl").exists() or not any((tmp_path / "dl").iterdir())


def test_a_listed_length_that_is_no_length_fails_that_blob_alone() -> None:
    """`12abc` and 10^30 stopped the whole job (and 10^30 was a SQLite OverflowError); now the page is read, the
    two blobs carry an invalid length (their own operation fails with one line), the third is whole."""
    from blobsync.backends.azure.listing import parse_listing
    from blobsync.backends.base import INVALID_LENGTH

    def blob(name: str, length: str) -> str:
        return f"<Blob><Name>{name}</Name><Properties><Content-Length>{length}</Content-Length></Properties></Blob>"

    for page in ('<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs>' + blob("a", "12abc")
                 + blob("b", "1" + "0" * 30) + blob("c", "3") + "</Blobs><NextMarker/></EnumerationResults>",
                 '<?xml version="1.0" encoding="utf-8"?><EnumerationResults> <Blobs>' + blob("a", "12abc")
                 + blob("b", "1" + "0" * 30) + blob("c", "3") + "</Blobs><NextMarker/></EnumerationResults>"):
        listed, marker = parse_listing(page.encode())  # the scanner's reading, and the XML tree's
        assert [(p.name, p.size) for p in listed] == [("a", INVALID_LENGTH), ("b", INVALID_LENGTH), ("c", 3)]
        assert marker == ""


def test_a_next_marker_that_never_ends_is_one_line(tmp_path: Path) -> None:
    """Every page names the same NextMarker (issue 51: the listing looped forever)."""
    page = _xml_answer((_LISTED % b"a.bin").replace(b"<NextMarker/>", b"<NextMarker>again</NextMarker>"))
    with _Server(page) as server:
        base = f"http://127.0.0.1:{server.port}/devstoreaccount1/cont"
        for args in (["ls", base], ["cp", "-r", f"{base}/*", str(tmp_path / "dl"), "--journal", str(tmp_path / "j")],
                     ["sync", base, str(tmp_path / "dl"), "--journal", str(tmp_path / "j")]):
            done = run([*args, "--max-retries", "1"], timeout=60)
            assert done.returncode == 1 and "Traceback" not in done.stderr, (args, done.stderr)
            assert "the same NextMarker twice" in done.stderr, done.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["--cluster", "notascheme"], "a Dask scheduler's address"),
    (["--cluster", "http://127.0.0.1:1"], "that is a web address"),
    (["--cluster", "local:5000"], "local:N takes a number of workers from 1 to 256"),
    (["--cluster", "local:99999"], "local:N takes a number of workers from 1 to 256"),
    (["--list-of-files", "/dev/urandom"], "--list-of-files '/dev/urandom': line"),
])
def test_unbounded_or_wrong_arguments_are_one_line_at_once(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "src").mkdir()
    done = run(["cp", str(tmp_path / "src"), "http://127.0.0.1:9/devstoreaccount1/cont", "--recursive",
                "--journal", str(tmp_path / "j"), *args], timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and said in lines[0], done.stderr


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_url_port_out_of_range_is_one_line(port: str) -> None:
    done = run(["ls", f"http://127.0.0.1:{port}/devstoreaccount1/cont"], timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and f"port '{port}' is not a port" in lines[0], done.stderr
