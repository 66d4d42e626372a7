"""No exception blobsync raises carries a SAS in its message, its cause or context chain, or its attributes
(issue 26, point 6): a real server answering a malformed response, the library call's error walked whole."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

import blobsync

SIG = "c2VjcmV0LXNpZ25hdHVyZQ%3D%3D"


@pytest.fixture
def broken_server() -> Iterator[int]:
    """Answers every request with a header aiohttp's parser refuses (Content-Length: abc)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nhello")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]


def test_no_error_from_the_library_carries_the_sas(broken_server: int) -> None:
    url = f"http://127.0.0.1:{broken_server}/devstoreaccount1/cont?sv=2022-11-02&sp=rl&sig={SIG}"
    with pytest.raises(blobsync.BlobsyncError) as caught:
        blobsync.list_blobs(url, max_retries=0)
    for e in _chain(caught.value):
        shown = " ".join([str(e), repr(e), repr(e.args), repr(vars(e)) if hasattr(e, "__dict__") else ""])
        assert "c2VjcmV0" not in shown, (type(e), shown)
        assert not type(e).__module__.startswith("aiohttp"), type(e)
